// src/cuda/gelu.cu: the cuda backend's GELU, tanh form (GPT-2; torch gelu(approximate="tanh")),
// and its derivative, elementwise in the tensor's precision - the cpu backend's formulas,
// detail::gelu / gelu_grad (float32: CUDA's tanhf, within 2 ulp as the C library's; nvcc's FMA
// contraction only removes roundings),
// so the cpu bound of docs/NUMERICS.md holds. Checked against the reference backend by
// tests/ops/test_gelu.cpp (CudaMatchesRefWithinTheBound).
#include "core/math.hpp"
#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

// out[i] = gelu(inp[i])
template <class T>
__global__ void gelu_forward_kernel(int64_t n, const T* inp, T* out) {
    for (int64_t i = grid_first(); i < n; i += grid_step()) {
        out[i] = detail::gelu(inp[i]);
    }
}

// dinp[i] = gelu'(inp[i]) * dout[i]
template <class T>
__global__ void gelu_backward_kernel(int64_t n, const T* inp, const T* dout, T* dinp) {
    for (int64_t i = grid_first(); i < n; i += grid_step()) {
        dinp[i] = detail::gelu_grad(inp[i]) * dout[i];
    }
}

}  // namespace

void gelu_forward(const detail::GeluJob& j) {
    if (j.n == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        gelu_forward_kernel<T><<<blocks_for(j.n, 256), 256, 0, stream_of(j.ctx)>>>(j.n, static_cast<const T*>(j.inp),
                                                                                   static_cast<T*>(j.out));
    });
    check_launch("gelu_forward_kernel");
}

void gelu_backward(const detail::GeluJob& j) {
    if (j.n == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        gelu_backward_kernel<T><<<blocks_for(j.n, 256), 256, 0, stream_of(j.ctx)>>>(
            j.n, static_cast<const T*>(j.inp), static_cast<const T*>(j.dout), static_cast<T*>(j.out));
    });
    check_launch("gelu_backward_kernel");
}

}  // namespace fp8kit::cuda
