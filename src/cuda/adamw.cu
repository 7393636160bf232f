// src/cuda/adamw.cu: the cuda backend's AdamW update (torch.optim.AdamW), elementwise in the
// tensor's precision, detail::adamw_at as the cpu backend (float32: CUDA's correctly rounded
// sqrtf and division; nvcc's FMA contraction only removes roundings), so the cpu bound of
// docs/NUMERICS.md holds. Checked against the reference backend by tests/ops/test_adamw.cpp
// (the cuda part of CpuMatchesRefWithinTheBound).
#include "core/math.hpp"
#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

template <class T>
__global__ void adamw_kernel(detail::AdamWJob j) {
    for (int64_t i = grid_first(); i < j.n; i += grid_step()) {
        detail::adamw_at<T>(j, i);
    }
}

}  // namespace

void adamw_update(const detail::AdamWJob& j) {
    if (j.n == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        adamw_kernel<T><<<blocks_for(j.n, 256), 256, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("adamw_kernel");
}

}  // namespace fp8kit::cuda
