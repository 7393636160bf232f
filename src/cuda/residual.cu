// src/cuda/residual.cu: the cuda backend's residual add, in the tensor's precision (one rounded
// addition per element: the bits of every other backend). Checked against the reference backend
// by tests/ops/test_residual.cpp (CudaEqualsRefBitForBit).
#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

template <class T>
__global__ void residual_forward_kernel(int64_t n, int64_t period, const T* inp, const T* residual, T* out) {
    for (int64_t i = grid_first(); i < n; i += grid_step()) {
        out[i] = inp[i] + residual[i % period];
    }
}

}  // namespace

void residual_forward(const detail::ResidualJob& j) {
    if (j.n == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        residual_forward_kernel<T><<<blocks_for(j.n, 256), 256, 0, stream_of(j.ctx)>>>(
            j.n, j.period, static_cast<const T*>(j.inp), static_cast<const T*>(j.residual), static_cast<T*>(j.out));
    });
    check_launch("residual_forward_kernel");
}

}  // namespace fp8kit::cuda
