// src/cuda/common.cuh: what every CUDA source of the backend shares - the check that turns a
// failed CUDA call into an fp8kit::Error naming the call, the stream of an ExecContext, element
// loads of f32/bf16/f16 matrices, and the amax reduction on float bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops.hpp"

namespace fp8kit::cuda {

// fp8kit::Error "fp8kit cuda: <call> failed: <error name> (<description>)" unless e is cudaSuccess.
void check(cudaError_t e, const char* call);
#define FP8KIT_CUDA_CHECK(call) ::fp8kit::cuda::check((call), #call)
// After a kernel launch: a bad configuration or a fault of an earlier kernel, named after `kernel`.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline cudaStream_t stream_of(const ExecContext& ctx) noexcept { return static_cast<cudaStream_t>(ctx.stream); }

// Element (i, j) of an f32 / bf16 / f16 matrix, as float (exact).
__device__ inline float load_element(const detail::MatrixRef& x, int64_t i, int64_t j) {
    const int64_t at = i * x.ld + j;
    switch (x.dtype) {
        case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(x.data)[at]);
        case DType::f16: return __half2float(static_cast<const __half*>(x.data)[at]);
        default: return static_cast<const float*>(x.data)[at];
    }
}

// |v| as bits in an order where max() is ref's max_abs: finite and Inf magnitudes order as their
// bits do, and every NaN maps to the canonical NaN, whose bits are above +Inf's - so a NaN wins
// every max and the result is ref's canonical NaN, in any reduction order.
__device__ inline uint32_t abs_key(float v) {
    const uint32_t a = __float_as_uint(v) & 0x7fffffffu;
    return a > 0x7f800000u ? detail::canonical_nan_bits : a;
}

// The max of `key` over a warp, in every lane.
__device__ inline uint32_t warp_max(uint32_t key) {
    for (int o = 16; o > 0; o >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, o));
    return key;
}

inline unsigned blocks_for(int64_t n, int threads, unsigned cap = 65535u * 8) {
    const int64_t b = (n + threads - 1) / threads;
    return unsigned(b < 1 ? 1 : b > cap ? cap : b);
}

}  // namespace fp8kit::cuda

// The backend's operations (src/cuda/quantize.cu, gemm.cu, matmul.cu, gelu.cu), gathered by
// src/cuda/device.cu.
namespace fp8kit::cuda {
void amax(const ExecContext& ctx, const detail::MatrixRef& x, float* out);
void group_amax(const ExecContext& ctx, const detail::MatrixRef& x, GroupShape group, float* out);
void quantize(detail::QuantizeJob& job);
void dequantize(const detail::DequantizeJob& job);
std::shared_ptr<const void> pack_weight(const ExecContext& ctx, const detail::GemmOperand& b, int64_t kgroup,
                                        size_t* bytes);
void gemm(detail::GemmJob& job);
void matmul(const detail::MatmulJob& job);
void bias_grad(const detail::BiasGradJob& job);
void gelu_forward(const detail::GeluJob& job);
void gelu_backward(const detail::GeluJob& job);
}  // namespace fp8kit::cuda
