// src/cuda/gemm_gemv.cu: the cuda GEMM at a decode step's few rows, e4m3 / e5m2 operands, any
// epilogue. Such a GEMM reads each code of B once for a few products, so it is bound by B's bytes,
// which tiles of 128 rows of A waste: fp8kit's 128 x 128 tiles left a few dozen blocks for an
// 8192^2 weight (107 us at m = 1 on an H200), and cuBLASLt streamed it at m = 1-16 no faster than
// the bf16 GEMM reads twice the bytes (m = 4: 37 us against bf16's 35). Two kernels, chosen by
// FP8KIT_CUDA_GEMV:
//  - cuda_cores (the default; measured): m <= 2, one K group or groups of a multiple of 16. A warp
//    streams a row of B and the CUDA cores decode codes to floats. On an H200 (2026-12-04) an
//    8192^2 weight took 20.5 us at m = 1 (0.76 of the copy bandwidth), 30.5 us at m = 2, where
//    torch._scaled_mm took 41.8 and 38.6 us and bf16 35 us; at m = 4, 52.6 us (cuBLASLt 37.2): the
//    decode of A's rows per code of B grows with m, hence m <= 2.
//    Numerics: every FP8 product is exact in float32; a lane sums the 16 products of a chunk in
//    float32, then promotes the chunk's sum with its K group's scales (acc += part * (sa * sb)) -
//    with one K group the scales multiply once at the end - and the warp adds its lanes' sums in a
//    fixed order: each term passes at most 24 + K / 512 roundings (15 in its chunk, K / 512 in its
//    lane, 5 across the warp, the scales and alpha), fewer than the K + 3 of the float64 bound that
//    the other engines meet (gamma_(K+3) |alpha| sum|a b|) for every K it takes.
//  - mma (opt-in; written without a GPU at hand, not yet run on one): m <= 16, one K group or
//    groups of a multiple of 32, sm_89 and newer. A and B swap roles on the tensor cores: mma.sync
//    m16n8k32 takes 16 rows of B as its 16-row operand and A's rows, padded with zeros to 8 or 16,
//    as its 8 columns, so a warp streams 16 rows of B and the tensor cores, not the CUDA cores,
//    turn codes into products, whatever m. The 8 warps of a block share 16 columns of D and take K
//    in slices of whole 128s, added in shared memory in a fixed order.
//    Numerics: those of the tensor-core kernels (NUMERICS.md): every k32 step covers 32 consecutive
//    K (each lane loads 8 bytes of a row, the same k of A and B), the tensor cores sum at most 128
//    of K - one step at a time for K groups narrower than 128 or not a multiple of it - before each
//    promotion acc += part * (sa * sb) in float32; with one K group acc += part and the scales
//    multiply at the end. On Hopper the FP8 sums keep about 14 bits: the test bounds this kernel by
//    the wgmma kernel's truncation term.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound; its decode
// shapes; ctest runs the grid with each FP8KIT_CUDA_GEMV) when a GPU is present; timed by
// bench/bench_torch_cuda.py (section decode).
#include <cuda_fp8.h>

#include <string_view>

#include "cuda/gemm_kernels.cuh"

namespace fp8kit::cuda {

namespace {

constexpr int gemv_warps = 8;
constexpr int cores_max_m = 2;                              // cuda_cores: rows of A
constexpr int mma_max_m = 16, mma_cols = 16;                // mma: rows of A, columns of D a block
constexpr int chunk_steps = 4, chunk_k = 32 * chunk_steps;  // mma: the k32 steps a warp loads at once

// ---- cuda_cores ----

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
__global__ void __launch_bounds__(32 * gemv_warps) gemm_gemv_cores_kernel(GemmJob j) {
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

// ---- mma ----

__device__ inline uint2 load8(const uint8_t* row, int64_t kk, bool stream) {
    const auto* p = reinterpret_cast<const uint2*>(row + kk);
    return stream ? __ldcs(p) : __ldg(p);  // B is read once: streamed past the caches; A by every block
}

// D[i, n0 + c] for i < m, c < 16, by one block: MT mma tiles of 8 rows of A. Lane (g, t) = (lane / 4,
// lane % 4) loads the 8 bytes at k + 8 t of B's rows n0 + g and n0 + g + 8 (the mma's 16-row operand,
// registers {g: k..k+3, g + 8: k..k+3, g: k+4..k+7, g + 8: k+4..k+7}) and of A's rows 8 mt + g (its
// 8-column operand), and holds D at B rows n0 + g + 8 h, A rows 8 mt + 2 t + c as d[2 h + c].
template <Format FA, Format FB, int MT>
__global__ void __launch_bounds__(32 * gemv_warps, 2) gemm_gemv_mma_kernel(GemmJob j, int steps, int64_t warp_k) {
    __shared__ float partial[gemv_warps][MT][4][32];
    const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane >> 2, t = lane & 3;
    const int64_t n0 = int64_t(blockIdx.x) * mma_cols;
    const bool one_group = j.kgroup >= j.k;

    const uint8_t* b_row[2];  // null past n: its codes load as zeros
    int64_t b_at[2];          // where each of the thread's columns starts in B's scales
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int64_t col = n0 + g + 8 * h;
        b_row[h] = col < j.n ? j.b.data + col * j.b.ld + 8 * t : nullptr;
        b_at[h] = min(col, j.n - 1) / j.b.group.rows * j.b.scale_cols;
    }
    const uint8_t* a_row[MT];
    int64_t a_at[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int64_t i = 8 * mt + g;
        a_row[mt] = i < j.m ? j.a.data + i * j.a.ld + 8 * t : nullptr;
#pragma unroll
        for (int c = 0; c < 2; ++c) a_at[mt][c] = min(int64_t(8 * mt + 2 * t + c), j.m - 1) / j.a.group.rows * j.a.scale_cols;
    }

    float acc[MT][4] = {}, part[MT][4] = {};
    const int64_t k_end = min(j.k, (warp + 1) * warp_k);
    for (int64_t kc = warp * warp_k; kc < k_end; kc += chunk_k) {
        uint2 b[chunk_steps][2], a[chunk_steps][MT];
#pragma unroll
        for (int s = 0; s < chunk_steps; ++s) {
            const int64_t kk = kc + 32 * s;
            const bool in_k = kk + 8 * t < k_end;  // K is a multiple of 16, so 8 bytes are all in or all out
#pragma unroll
            for (int h = 0; h < 2; ++h) b[s][h] = in_k && b_row[h] != nullptr ? load8(b_row[h], kk, true) : make_uint2(0, 0);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) a[s][mt] = in_k && a_row[mt] != nullptr ? load8(a_row[mt], kk, false) : make_uint2(0, 0);
        }
#pragma unroll
        for (int s = 0; s < chunk_steps; ++s) {
            const int64_t kk = kc + 32 * s;
            if (kk >= k_end) break;
            const uint32_t bf[4] = {b[s][0].x, b[s][1].x, b[s][0].y, b[s][1].y};
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const uint32_t af[2] = {a[s][mt].x, a[s][mt].y};
                mma_fp8<FB, FA>(part[mt], bf, af);
            }
            if ((s + 1) % steps != 0 && kk + 32 < k_end) continue;
            // Promotion: this step's (or chunk's) K group scales, or none with one group.
            // (K < 2^31, so 32-bit divisions: this runs every k32 step for narrow groups; a group
            // as wide as K or wider is group 0.)
            float sb[2] = {1.0f, 1.0f}, sa[MT][2];
            uint32_t ga = 0;
            if (!one_group) {
                const uint32_t gb = uint32_t(kk) / uint32_t(min(j.b.group.cols, j.k));
                ga = uint32_t(kk) / uint32_t(min(j.a.group.cols, j.k));
#pragma unroll
                for (int h = 0; h < 2; ++h) sb[h] = scale_at(j.b, b_at[h] + gb);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) sa[mt][c] = one_group ? 1.0f : scale_at(j.a, a_at[mt][c] + ga);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[mt][e] = one_group ? acc[mt][e] + part[mt][e] : fmaf(part[mt][e], sa[mt][e & 1] * sb[e >> 1], acc[mt][e]);
                    part[mt][e] = 0.0f;
                }
            }
        }
    }

    // The warps' K slices added in warp order, then the epilogue: warp w < 4 MT takes d[w % 4] of tile w / 4.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) partial[warp][mt][e][lane] = acc[mt][e];
    }
    __syncthreads();
    if (warp >= 4 * MT) return;
    const int mt = warp / 4, e = warp % 4;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < gemv_warps; ++w) v += partial[w][mt][e][lane];
    const int64_t i = 8 * mt + 2 * t + (e & 1), col = n0 + g + 8 * (e >> 1);
    if (i >= j.m || col >= j.n) return;
    epilogue_store(j, i, col,
                   one_group ? j.alpha * (v * (operand_scale(j.a, i, 0) * operand_scale(j.b, col, 0))) : j.alpha * v);
}

enum class GemvWay { cuda_cores, mma };

// FP8KIT_CUDA_GEMV: which kernel takes the decode rows - "cuda_cores" (the default, measured) or
// "mma"; anything else is an error naming the setting. Read once.
GemvWay gemv_way() {
    static const GemvWay way = [] {
        const char* env = std::getenv("FP8KIT_CUDA_GEMV");
        if (env == nullptr || *env == '\0' || std::string_view(env) == "cuda_cores") return GemvWay::cuda_cores;
        if (std::string_view(env) == "mma") return GemvWay::mma;
        throw Error("FP8KIT_CUDA_GEMV=" + std::string(env) + " is not a decode rows' kernel, expected cuda_cores or mma");
    }();
    return way;
}

template <Format FA, Format FB>
void launch(const GemmJob& j, cudaStream_t s) {
    if (gemv_way() == GemvWay::cuda_cores) {
        const unsigned blocks = unsigned((j.n + gemv_warps - 1) / gemv_warps);
        if (j.m == 1) {
            gemm_gemv_cores_kernel<FA, FB, 1><<<blocks, 32 * gemv_warps, 0, s>>>(j);
        } else {
            gemm_gemv_cores_kernel<FA, FB, cores_max_m><<<blocks, 32 * gemv_warps, 0, s>>>(j);
        }
        check_launch("gemm_gemv_cores_kernel");
        return;
    }
    const unsigned blocks = unsigned((j.n + mma_cols - 1) / mma_cols);
    // Each warp a slice of K of whole chunks; promotions every 128 of K where the K groups allow.
    const int64_t chunks = (j.k + chunk_k - 1) / chunk_k;
    const int64_t warp_k = (chunks + gemv_warps - 1) / gemv_warps * chunk_k;
    const int steps = j.kgroup >= j.k || j.kgroup % chunk_k == 0 ? chunk_steps : 1;
    if (j.m <= 8) {
        gemm_gemv_mma_kernel<FA, FB, 1><<<blocks, 32 * gemv_warps, 0, s>>>(j, steps, warp_k);
    } else {
        gemm_gemv_mma_kernel<FA, FB, 2><<<blocks, 32 * gemv_warps, 0, s>>>(j, steps, warp_k);
    }
    check_launch("gemm_gemv_mma_kernel");
}

}  // namespace

bool gemv_fits(const GemmJob& j) {
    const bool operands = j.m >= 1 && j.k > 0 && j.k % 16 == 0 && tensor_core_format(j.a.format) &&
                          tensor_core_format(j.b.format) && j.a.ld % 16 == 0 && j.b.ld % 16 == 0 &&
                          aligned16(j.a.data) && aligned16(j.b.data);
    if (gemv_way() == GemvWay::cuda_cores) return operands && j.m <= cores_max_m && (j.kgroup >= j.k || j.kgroup % 16 == 0);
    return operands && compute_capability() >= 89 && j.m <= mma_max_m && j.k <= INT32_MAX &&
           (j.kgroup >= j.k || j.kgroup % 32 == 0);
}

void launch_gemv(const GemmJob& j, cudaStream_t s) {
    with_tensor_core_formats(j, [&](auto fa, auto fb) { launch<decltype(fa)::value, decltype(fb)::value>(j, s); });
}

}  // namespace fp8kit::cuda
