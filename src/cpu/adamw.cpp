// src/cpu/adamw.cpp: the cpu backend's AdamW update (torch.optim.AdamW), elementwise in the
// tensor's precision in the order of <fp8kit/ops.hpp>'s formula (detail::adamw_at), split over
// OpenMP threads. Checked against the reference backend by tests/ops/test_adamw.cpp.
#include "core/math.hpp"
#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void adamw(const detail::AdamWJob& job) {
    const detail::AdamWJob j = job;  // a local copy: the stores through its pointers never alias its fields
#pragma omp parallel for schedule(static) if (j.n > parallel_min_work)
    for (int64_t i = 0; i < j.n; ++i) detail::adamw_at<T>(j, i);
}

}  // namespace

void adamw_update(const detail::AdamWJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { adamw<T>(j); });
}

}  // namespace fp8kit::cpu
