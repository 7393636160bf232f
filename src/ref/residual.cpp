// src/ref/residual.cpp: the reference residual add - each sum formed in float64 and rounded once
// (for float32 the same bits as a float32 addition: float64 keeps more than twice float32's
// precision, so the double rounding is innocuous). The ground truth of tests/ops/test_residual.cpp.
#include "core/ops.hpp"

namespace fp8kit::ref {

void residual_forward(const detail::ResidualJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        const T* x = static_cast<const T*>(j.inp);
        const T* r = static_cast<const T*>(j.residual);
        T* out = static_cast<T*>(j.out);
        for (int64_t i = 0; i < j.n; ++i) out[i] = T(double(x[i]) + double(r[i % j.period]));
    });
}

}  // namespace fp8kit::ref
