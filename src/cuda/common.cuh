// src/cuda/common.cuh: what every CUDA source of the backend shares - the check that turns a
// failed CUDA call into an fp8kit::Error naming the call, the stream of an ExecContext, device
// memory for scratch (src/cuda/device.cu), element loads of f32/bf16/f16 matrices, the amax
// reduction on float bits, and a block reduction.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/ops.hpp"

namespace fp8kit::cuda {

// fp8kit::Error "fp8kit cuda: <call> failed: <error name> (<description>)" unless e is cudaSuccess.
void check(cudaError_t e, const char* call);
#define FP8KIT_CUDA_CHECK(call) ::fp8kit::cuda::check((call), #call)
// After a kernel launch: a bad configuration or a fault of an earlier kernel, named after `kernel`.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline cudaStream_t stream_of(const ExecContext& ctx) noexcept { return static_cast<cudaStream_t>(ctx.stream); }

// Device memory on this thread's stream, and zeroing it: the allocate and zero entries of the
// backend's detail::DeviceMemory (core/ops.hpp says how they behave), for the kernels' scratch too.
std::shared_ptr<std::byte> allocate(size_t bytes);
void zero(void* dst, size_t bytes);

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

// The reductions of warp_reduce and block_reduce.
struct Sum {
    template <class T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
    template <class T>
    __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// op-reduction of v over a warp, in every lane, by butterfly shuffles (a fixed order).
template <class T, class Op>
__device__ T warp_reduce(T v, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The max of `key` over a warp, in every lane.
__device__ inline uint32_t warp_max(uint32_t key) { return warp_reduce(key, Max{}); }

// op-reduction of v over the block's threads, in every thread, in a fixed order (so run to run the
// same): within each warp, then the warps' results in every warp. blockDim.x is a multiple of 32;
// `identity` pads the missing warps (0 for a sum, -inf for a max); `scratch` is 32 values of shared
// memory. Ends with a barrier, so the caller may reuse `scratch` at once.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity, T* scratch) {
    v = warp_reduce(v, op);
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = warp_reduce(lane < blockDim.x / 32 ? scratch[lane] : identity, op);
    __syncthreads();
    return v;
}

// A grid-stride loop's first index for this thread and its step:
//   for (int64_t i = grid_first(); i < n; i += grid_step())
__device__ inline int64_t grid_first() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

inline unsigned blocks_for(int64_t n, int threads, unsigned cap = 65535u * 8) {
    const int64_t b = (n + threads - 1) / threads;
    return unsigned(b < 1 ? 1 : b > cap ? cap : b);
}

}  // namespace fp8kit::cuda

// The backend's operations (src/cuda/<family>.cu: quantize, gemm, and the layer ops matmul, gelu,
// layernorm, attention, crossentropy, embedding, adamw, residual), gathered by src/cuda/device.cu.
namespace fp8kit::cuda {
void amax(const ExecContext& ctx, const detail::MatrixRef& x, float* out);
void group_amax(const ExecContext& ctx, const detail::MatrixRef& x, GroupShape group, float* out);
void quantize(detail::QuantizeJob& job);
void dequantize(const detail::DequantizeJob& job);
std::shared_ptr<const void> pack_weight(const ExecContext& ctx, const detail::GemmOperand& b, int64_t kgroup,
                                        bool lasting, size_t* bytes);
bool unpack_weight(const void* packed, uint8_t* out, int64_t ld);
void gemm(detail::GemmJob& job);
void matmul(const detail::MatmulJob& job);
void bias_grad(const detail::BiasGradJob& job);
void gelu_forward(const detail::GeluJob& job);
void gelu_backward(const detail::GeluJob& job);
void layernorm_forward(const detail::NormJob& job);
void layernorm_backward(const detail::NormBackwardJob& job);
void rmsnorm_forward(const detail::NormJob& job);
void rmsnorm_backward(const detail::NormBackwardJob& job);
void attention_forward(const detail::AttentionJob& job);
void attention_backward(const detail::AttentionJob& job);
void attention_decode(const detail::AttentionDecodeJob& job);
void crossentropy_forward(const detail::CrossEntropyJob& job);
void crossentropy_backward(const detail::CrossEntropyJob& job);
void embedding_forward(const detail::EmbeddingJob& job);
void embedding_backward(const detail::EmbeddingJob& job);
void adamw_update(const detail::AdamWJob& job);
void residual_forward(const detail::ResidualJob& job);
}  // namespace fp8kit::cuda
