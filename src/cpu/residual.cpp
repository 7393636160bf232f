// src/cpu/residual.cpp: the cpu backend's residual add, in the tensor's precision, each period of
// the residual (a row of the broadcast) one loop the compiler vectorizes, rows split over OpenMP
// threads. Checked against the reference backend, bit for bit, by tests/ops/test_residual.cpp.
#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

void residual_forward(const detail::ResidualJob& j) {
    if (j.n == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        const T* x = static_cast<const T*>(j.inp);
        const T* r = static_cast<const T*>(j.residual);
        T* out = static_cast<T*>(j.out);
        const int64_t rows = j.n / j.period, p = j.period;
#pragma omp parallel for schedule(static) if (j.n > parallel_min_work)
        for (int64_t row = 0; row < rows; ++row)
            for (int64_t i = 0; i < p; ++i) out[row * p + i] = x[row * p + i] + r[i];
    });
}

}  // namespace fp8kit::cpu
