// src/cuda/gemm_gemv.cu: the cuda GEMM at a decode step's one or two rows on the CUDA cores:
// e4m3 / e5m2 operands, one K group or groups of a multiple of 16, any epilogue. Such a GEMM reads
// each code of B once for one or two products, so it is bound by B's bytes: here a warp streams a
// row of B. On an H200 (2026-12-04) an 8192^2 weight took 20.5 us at m = 1 (0.76 of the copy
// bandwidth), 30.5 us at m = 2, where torch._scaled_mm (cuBLASLt) took 41.8 and 38.6 us and the
// bf16 GEMM 35 us, and fp8kit's tensor-core kernel (128 x 128 tiles: a few dozen blocks) 107 us;
// at m = 4 this kernel took 52.6 us to cuBLASLt's 37.2, so larger m go to the other engines.
// Numerics: every FP8 product is exact in float32; a lane sums the 16 products of a chunk in
// float32, then promotes the chunk's sum with its K group's scales (acc += part * (sa * sb)) -
// with one K group the scales multiply once at the end - and the warp adds its lanes' sums in a
// fixed order: each term passes at most 24 + K / 512 roundings (15 in its chunk, K / 512 in its
// lane, 5 across the warp, the scales and alpha), fewer than the K + 3 of the float64 bound that
// the other engines meet (gamma_(K+3) |alpha| sum|a b|) for every K it takes.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound; its decode
// shapes) when a GPU is present.
#include <cuda_fp8.h>

#include "cuda/gemm_kernels.cuh"

namespace fp8kit::cuda {

namespace {

constexpr int gemv_warps = 8, gemv_max_m = 2;

// The 16 codes of a 16-byte chunk as floats, exactly (every e4m3 and e5m2 value is a half; the
// hardware converts two codes at a time, the lower byte into the lower half).
template <Format F>
__device__ inline void decode16(uint4 chunk, float (&v)[16]) {
    const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[q] >> (16 * h)),
                                                                F == Format::e4m3fn ? __NV_E4M3 : __NV_E5M2);
            const float2 f = __half22float2(__half2(pair));
            v[4 * q + 2 * h] = f.x;
            v[4 * q + 2 * h + 1] = f.y;
        }
    }
}

// D[i, col] for i < m (<= M) by one warp per column of D (a row of B): lane l takes the chunks
// of 16 codes at k = 16 l, 16 l + 512, ... of B's row and of each of A's rows.
template <Format FA, Format FB, int M>
__global__ void __launch_bounds__(32 * gemv_warps) gemm_gemv_kernel(GemmJob j) {
    const int lane = threadIdx.x % 32;
    const int64_t col = int64_t(blockIdx.x) * gemv_warps + threadIdx.x / 32;
    if (col >= j.n) return;  // the whole warp
    const bool one_group = j.kgroup >= j.k;
    const uint8_t* b = j.b.data + col * j.b.ld;
    float acc[M] = {};
    for (int64_t k0 = int64_t(lane) * 16; k0 < j.k; k0 += 32 * 16) {
        float bv[16];
        decode16<FB>(__ldcs(reinterpret_cast<const uint4*>(b + k0)), bv);  // read once: streamed past the caches
#pragma unroll
        for (int i = 0; i < M; ++i) {
            if (i >= j.m) break;
            float av[16];
            decode16<FA>(__ldg(reinterpret_cast<const uint4*>(j.a.data + i * j.a.ld + k0)), av);
            float part = av[0] * bv[0];
#pragma unroll
            for (int e = 1; e < 16; ++e) part = fmaf(av[e], bv[e], part);
            acc[i] = one_group ? acc[i] + part
                               : fmaf(part, operand_scale(j.a, i, k0) * operand_scale(j.b, col, k0), acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
        if (i >= j.m) break;
        const float sum = warp_reduce(acc[i], Sum{});
        if (lane == i) {
            const float v = one_group ? j.alpha * (sum * (operand_scale(j.a, i, 0) * operand_scale(j.b, col, 0)))
                                      : j.alpha * sum;
            epilogue_store(j, i, col, v);
        }
    }
}

template <Format FA, Format FB>
void launch(const GemmJob& j, cudaStream_t s) {
    const unsigned blocks = unsigned((j.n + gemv_warps - 1) / gemv_warps);
    if (j.m == 1) {
        gemm_gemv_kernel<FA, FB, 1><<<blocks, 32 * gemv_warps, 0, s>>>(j);
    } else {
        gemm_gemv_kernel<FA, FB, gemv_max_m><<<blocks, 32 * gemv_warps, 0, s>>>(j);
    }
    check_launch("gemm_gemv_kernel");
}

}  // namespace

bool gemv_fits(const GemmJob& j) {
    return j.m >= 1 && j.m <= gemv_max_m && j.k > 0 && j.k % 16 == 0 && (j.kgroup >= j.k || j.kgroup % 16 == 0) &&
           tensor_core_format(j.a.format) && tensor_core_format(j.b.format) && j.a.ld % 16 == 0 && j.b.ld % 16 == 0 &&
           aligned16(j.a.data) && aligned16(j.b.data);
}

void launch_gemv(const GemmJob& j, cudaStream_t s) {
    with_tensor_core_formats(j, [&](auto fa, auto fb) { launch<decltype(fa)::value, decltype(fb)::value>(j, s); });
}

}  // namespace fp8kit::cuda
