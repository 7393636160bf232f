// src/cuda/gemm.cu: the CUDA backend's scaled FP8 GEMM, D[m, n] = epilogue(alpha * sum over K
// groups of (A_g . B_g^T) * sa * sb), with B [n, k] as a Linear weight (TN):
//  - cuBLASLt FP8 with a plain epilogue, for the scalings it takes: tensor x tensor, row x row
//    (outer-vector scales) and block 1x128 x 128x128 (VEC128 / BLK128x128 scales, DeepSeek-V3's
//    recipe), dimensions multiples of 16 (K of 128 for blocks); its scale pointers take the device
//    scale_inv of each operand (A's 1x128 scales transposed on the device): no host round trip;
//  - own tensor-core kernels for every other K group of 32 to 128 or all of K (block 1x128 x
//    128x128 with DeepGEMM's numerics, mx32, rowwise, any shape and epilogue): products summed by
//    the tensor cores over at most 128 of K, then promoted into a float32 accumulator with their
//    group's scales, every K group - wgmma m64n128k32 on sm_90 (Hopper) for K groups of 128 or one
//    group (its stages loaded by cp.async, or by the copy engine with FP8KIT_CUDA_WGMMA=tma),
//    mma.sync m16n8k32 (sm_89 and sm_90a) for the rest;
//  - a plain CUDA-core kernel for the rest (e4m3fnuz / e5m2fnuz, which the tensor cores do not
//    take; K groups narrower than 32 or not a multiple of it; unaligned rows).
// The epilogue (beta C, bias, GELU, rounding to f32/bf16/f16) is that of NUMERICS.md in float32.
// High-precision A (the fused cast): A is quantized first by the cuda quantize (the same codes,
// scales and amax as quantize()) into a stream-ordered temporary, then multiplied.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound) when a GPU is
// present; timed by bench/bench_gemm_cuda.cpp against cuBLASLt and torch._scaled_mm.
//
// The tensor-core instructions are reached through PTX (mma.sync, wgmma, ldmatrix, cp.async, TMA,
// mbarrier): CUDA C++ has no intrinsic for FP8 matrix instructions. This is device code only; nvcc
// assembles it for every host platform.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "core/math.hpp"
#include "cuda/common.cuh"
#include "cuda/cublaslt.cuh"
#include "fp8kit/error.hpp"

namespace fp8kit::cuda {

namespace {

using detail::GemmJob;
using detail::GemmOperand;

// ---- shared pieces: scales and the epilogue ----

__device__ inline float scale_at(const GemmOperand& op, int64_t at) {
    return op.e8m0 ? decode(static_cast<const uint8_t*>(op.scale_inv)[at], Format::e8m0fnu)
                   : static_cast<const float*>(op.scale_inv)[at];
}
// The scale of element (row, kk) of an operand.
__device__ inline float operand_scale(const GemmOperand& op, int64_t row, int64_t kk) {
    return scale_at(op, (row / op.group.rows) * op.scale_cols + kk / op.group.cols);
}

__device__ inline float load_any(const void* p, DType t, int64_t at) {
    switch (t) {
        case DType::bf16: return float(static_cast<const bf16*>(p)[at]);
        case DType::f16: return float(static_cast<const f16*>(p)[at]);
        default: return static_cast<const float*>(p)[at];
    }
}

// out[i, j] from v = alpha * (scaled product), as detail::gemm_epilogue / gemm_store do on the host.
__device__ inline void epilogue_store(const GemmJob& j, int64_t i, int64_t col, float v) {
    if (j.c.data != nullptr) v += j.beta * load_any(j.c.data, j.c.dtype, i * j.c.ld + col);
    if (j.bias != nullptr) v += load_any(j.bias, j.bias_dtype, col);
    if (j.activation == Activation::gelu) v = detail::gelu(v);
    const int64_t at = i * j.n + col;
    switch (j.out_dtype) {
        case DType::bf16: static_cast<bf16*>(j.out)[at] = bf16(v); break;
        case DType::f16: static_cast<f16*>(j.out)[at] = f16(v); break;
        default: static_cast<float*>(j.out)[at] = v; break;
    }
}

// ---- CUDA cores: any format, any K group ----

constexpr int simt_tile = 64, simt_k = 16;

// A 64 x 64 tile of D per block of 256 threads (4 x 4 elements each); A and B staged decoded in
// shared memory 16 of K at a time; each K group's partial sum promoted as partial * (sa * sb).
__global__ void gemm_simt_kernel(GemmJob j) {
    __shared__ float as[simt_k][simt_tile], bs[simt_k][simt_tile];
    const int64_t i0 = int64_t(blockIdx.y) * simt_tile, j0 = int64_t(blockIdx.x) * simt_tile;
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    float acc[4][4] = {}, part[4][4] = {};
    const bool one_group = j.kgroup >= j.k;
    for (int64_t k0 = 0; k0 < j.k; k0 += simt_k) {
        for (int e = threadIdx.x; e < simt_k * simt_tile; e += 256) {
            const int r = e / simt_k, kk = e % simt_k;
            const int64_t k = k0 + kk;
            const bool in_k = k < j.k;
            as[kk][r] = in_k && i0 + r < j.m ? decode(j.a.data[(i0 + r) * j.a.ld + k], j.a.format) : 0.0f;
            bs[kk][r] = in_k && j0 + r < j.n ? decode(j.b.data[(j0 + r) * j.b.ld + k], j.b.format) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < simt_k && k0 + kk < j.k; ++kk) {
            for (int x = 0; x < 4; ++x) {
                for (int y = 0; y < 4; ++y) part[x][y] = fmaf(as[kk][tr * 4 + x], bs[kk][tc * 4 + y], part[x][y]);
            }
            const int64_t k = k0 + kk;
            if (!one_group && ((k + 1) % j.kgroup == 0 || k + 1 == j.k)) {  // the end of a K group: promote
                for (int x = 0; x < 4; ++x) {
                    const int64_t i = min(i0 + tr * 4 + x, j.m - 1);
                    const float sa = operand_scale(j.a, i, k);
                    for (int y = 0; y < 4; ++y) {
                        const float sb = operand_scale(j.b, min(j0 + tc * 4 + y, j.n - 1), k);
                        acc[x][y] = fmaf(part[x][y], sa * sb, acc[x][y]);
                        part[x][y] = 0.0f;
                    }
                }
            }
        }
        __syncthreads();
    }
    for (int x = 0; x < 4; ++x) {
        const int64_t i = i0 + tr * 4 + x;
        if (i >= j.m) continue;
        for (int y = 0; y < 4; ++y) {
            const int64_t col = j0 + tc * 4 + y;
            if (col >= j.n) continue;
            // K = 0: an empty sum, and no scale exists to read.
            const float v = j.k == 0    ? 0.0f
                            : one_group ? j.alpha * (part[x][y] * (operand_scale(j.a, i, 0) * operand_scale(j.b, col, 0)))
                                        : j.alpha * acc[x][y];
            epilogue_store(j, i, col, v);
        }
    }
}

// ---- tensor cores: mma.sync m16n8k32, FP8 operands, float32 accumulators ----

// 16 warps as 4 x 4, each 32 x 32 of D (2 x 4 mma tiles of 16 x 8): 128 x 128 per block. Why 16
// warps of 32 x 32 rather than 8 of 64 x 32: an H100 issues a warp's mma.sync only every few cycles,
// so the tensor pipe needs several warps per scheduler - 8 warps at 255 registers kept it 16%
// busy (ncu); at 32 x 32 a thread needs under 128 registers and 16 warps fit.
constexpr int tc_warps_m = 4, tc_warps_n = 4, tc_mt = 2, tc_nt = 4;
constexpr int tc_bm = tc_warps_m * tc_mt * 16, tc_bn = tc_warps_n * tc_nt * 8, tc_bk = 128, tc_stages = 3;
constexpr int tc_threads = 32 * tc_warps_m * tc_warps_n;
constexpr int tc_stage_bytes = (tc_bm + tc_bn) * tc_bk;
constexpr int tc_smem = tc_stages * tc_stage_bytes;
static_assert(tc_bm == tc_bn, "StageLoader copies as many rows of A as of B");

// Shared memory rows are 128 bytes (8 chunks of 16); chunk c of row r sits at chunk c ^ (r % 8),
// so the 8 rows an ldmatrix reads at one chunk fall in 8 different bank groups.
__device__ inline uint32_t swizzled(int row, int chunk) { return uint32_t(row * tc_bk + ((chunk ^ (row & 7)) << 4)); }

__device__ inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
    // src-size 0 fills the 16 bytes with zeros (rows past m or n, K past k): zero codes add nothing.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int pending>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(pending)); }

__device__ inline void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

template <Format FA, Format FB>
__device__ inline void mma_fp8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (FA == Format::e4m3fn && FB == Format::e4m3fn) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else if constexpr (FA == Format::e4m3fn && FB == Format::e5m2) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        static_assert(FA == Format::e5m2 && FB == Format::e4m3fn, "two e5m2 operands are refused by core");
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
#else
    (void)d, (void)a, (void)b;
    __trap();  // never launched below sm_89 (gemm() checks the device)
#endif
}

// What one thread of a block of `Threads` copies into each pipeline stage: chunk tid % 8 (16 bytes
// of K) of rows tid / 8 + (Threads / 8) i of the 128-row A tile and of the B tile, with zero fill
// past m, n and k. Both tensor-core kernels load their stages with it.
template <int Threads>
struct StageLoader {
    static constexpr int rows_per_pass = Threads / 8;
    const uint8_t *a, *b;     // this thread's first row of each tile, at its chunk
    int64_t a_step, b_step;   // rows_per_pass rows on
    int row, a_rows, b_rows;  // the first row, and the rows of each tile inside m / n
    uint32_t smem;            // offset of its first chunk in a stage (swizzled, so +rows * 128 per pass)

    __device__ StageLoader(const GemmJob& j, int64_t i0, int64_t j0) {
        row = int(threadIdx.x / 8);
        const int c = int(threadIdx.x % 8);
        a_rows = int(min(int64_t(tc_bm), j.m - i0));
        b_rows = int(min(int64_t(tc_bn), j.n - j0));
        a = j.a.data + (i0 + row) * j.a.ld + c * 16;
        b = j.b.data + (j0 + row) * j.b.ld + c * 16;
        a_step = rows_per_pass * j.a.ld;
        b_step = rows_per_pass * j.b.ld;
        smem = swizzled(row, c);
    }

    __device__ void load(uint32_t stage, int64_t kb, int64_t k, const GemmJob& j) const {
        const int64_t kk = kb * tc_bk;
        const bool in_k = kk + int64_t(threadIdx.x % 8) * 16 < k;
#pragma unroll
        for (int i = 0; i < tc_bm / rows_per_pass; ++i) {
            const int r = row + rows_per_pass * i;
            const bool va = in_k && r < a_rows, vb = in_k && r < b_rows;
            cp_async_16(stage + smem + i * rows_per_pass * tc_bk, va ? a + i * a_step + kk : j.a.data, va);
            cp_async_16(stage + tc_bm * tc_bk + smem + i * rows_per_pass * tc_bk, vb ? b + i * b_step + kk : j.b.data, vb);
        }
    }
};

// A 128 x 128 tile of D per block of 16 warps (4 x 4, each 32 x 32: 2 x 4 mma tiles of 16 x 8).
// K in blocks of 128 through a 3-stage cp.async pipeline. The mma's float32 sums run over
// `steps` k32 steps (a K group, at most 128 of K) and are then promoted: acc += part * (sa * sb)
// for groups narrower than K; with one group, acc += part and the scales multiply at the end.
template <Format FA, Format FB>
__global__ void __launch_bounds__(tc_threads, 1) gemm_mma_kernel(GemmJob j, int steps) {
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sbase = uint32_t(__cvta_generic_to_shared(smem));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / tc_warps_n, wn = warp % tc_warps_n;  // the warp's piece of D
    const int64_t i0 = int64_t(blockIdx.y) * tc_bm, j0 = int64_t(blockIdx.x) * tc_bn;
    const int64_t kblocks = (j.k + tc_bk - 1) / tc_bk;
    const bool one_group = j.kgroup >= j.k;

    // Where each of this thread's rows of A and rows of B (columns of D) starts in its scales.
    int a_at[tc_mt][2], b_at[tc_nt][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int t = 0; t < tc_mt; ++t) {
            const int64_t i = min(i0 + wm * tc_mt * 16 + t * 16 + (lane >> 2) + h * 8, j.m - 1);
            a_at[t][h] = int(i / j.a.group.rows * j.a.scale_cols);
        }
#pragma unroll
        for (int t = 0; t < tc_nt; ++t) {
            const int64_t col = min(j0 + wn * tc_nt * 8 + t * 8 + (lane & 3) * 2 + h, j.n - 1);
            b_at[t][h] = int(col / j.b.group.rows * j.b.scale_cols);
        }
    }
    const StageLoader<tc_threads> loader(j, i0, j0);
    float acc[tc_mt][tc_nt][4] = {}, part[tc_mt][tc_nt][4] = {};
    for (int s = 0; s < tc_stages - 1; ++s) {
        if (s < kblocks) loader.load(sbase + s * tc_stage_bytes, s, j.k, j);
        cp_async_commit();
    }
    int64_t kstep = 0;  // k32 steps done
    for (int64_t kb = 0; kb < kblocks; ++kb) {
        cp_async_wait<tc_stages - 2>();
        __syncthreads();
        const int64_t next = kb + tc_stages - 1;
        if (next < kblocks) loader.load(sbase + uint32_t(next % tc_stages) * tc_stage_bytes, next, j.k, j);
        cp_async_commit();
        const uint32_t sa_base = sbase + (kb % tc_stages) * tc_stage_bytes, sb_base = sa_base + tc_bm * tc_bk;
        #pragma unroll 1
        for (int ks = 0; ks < tc_bk / 32; ++ks, ++kstep) {
            if (kstep * 32 >= j.k) break;
            uint32_t a[tc_mt][4], b[tc_nt][2];
            #pragma unroll
            for (int mt = 0; mt < tc_mt; ++mt) {
                const int row = wm * tc_mt * 16 + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(sa_base + swizzled(row, 2 * ks + (lane >> 4)), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
            }
            #pragma unroll
            for (int np = 0; np < tc_nt / 2; ++np) {
                const int row = wn * tc_nt * 8 + np * 16 + (lane & 7) + (lane >> 4) * 8;
                ldmatrix_x4(sb_base + swizzled(row, 2 * ks + ((lane >> 3) & 1)), b[2 * np][0], b[2 * np][1],
                            b[2 * np + 1][0], b[2 * np + 1][1]);
            }
            #pragma unroll
            for (int mt = 0; mt < tc_mt; ++mt) {
                #pragma unroll
                for (int nt = 0; nt < tc_nt; ++nt) mma_fp8<FA, FB>(part[mt][nt], a[mt], b[nt]);
            }
            // Promotion at the end of each K group (or every 128 of K with one group), and at the end of K.
            if ((kstep + 1) % steps != 0 && (kstep + 1) * 32 < j.k) continue;
            float sb[tc_nt][2] = {};  // this K group's scales of the thread's columns
            if (!one_group) {
                const int gb = int(kstep * 32 / j.b.group.cols);
#pragma unroll
                for (int nt = 0; nt < tc_nt; ++nt) {
#pragma unroll
                    for (int c = 0; c < 2; ++c) sb[nt][c] = scale_at(j.b, b_at[nt][c] + gb);
                }
            }
            const int ga = int(kstep * 32 / j.a.group.cols);
#pragma unroll
            for (int mt = 0; mt < tc_mt; ++mt) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float sa = one_group ? 1.0f : scale_at(j.a, a_at[mt][h] + ga);
#pragma unroll
                    for (int nt = 0; nt < tc_nt; ++nt) {
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            float& p = part[mt][nt][h * 2 + c];
                            float& a = acc[mt][nt][h * 2 + c];
                            a = one_group ? a + p : fmaf(p, sa * sb[nt][c], a);
                            p = 0.0f;
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
    #pragma unroll
    for (int mt = 0; mt < tc_mt; ++mt) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t i = i0 + wm * tc_mt * 16 + mt * 16 + (lane >> 2) + h * 8;
            if (i >= j.m) continue;
            const float sa = one_group ? scale_at(j.a, a_at[mt][h]) : 1.0f;
            #pragma unroll
            for (int nt = 0; nt < tc_nt; ++nt) {
                #pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int64_t col = j0 + wn * tc_nt * 8 + nt * 8 + (lane & 3) * 2 + c;
                    if (col >= j.n) continue;
                    const float v = acc[mt][nt][h * 2 + c];
                    epilogue_store(j, i, col, one_group ? j.alpha * (v * (sa * scale_at(j.b, b_at[nt][c]))) : j.alpha * v);
                }
            }
        }
    }
}

// ---- Hopper tensor cores: wgmma m64n128k32 (sm_90a) ----
//
// Why a second tensor-core kernel: Hopper runs FP8 at its full rate only through wgmma, which
// reads both operands from shared memory for a warpgroup (4 warps) at once; mma.sync reached
// 0.1x cuBLASLt there (docs/PERF.md). The tile, the stages' layout and their loads are the mma.sync
// kernel's: 128 x 128 of D, K in blocks of 128, rows of 128 bytes with chunk c of row r at
// c ^ (r % 8) - exactly wgmma's 128-byte swizzle when a stage starts on 1024 bytes. Two
// warpgroups, each 64 rows x all 128 columns: per K block 4 wgmma (k32) into `part`, the tensor
// cores' float32 sums over 128 of K, then promoted into the float32 accumulator with the K group's
// scales - DeepGEMM's numerics. It takes K groups of exactly 128 whose B scales are one per 128
// columns (block 1x128 x 128x128, tensor x block), or one group over all of K (tensor, row: acc +=
// part, the scales at the end).
constexpr int wg_threads = 256, wg_stages = 5;
constexpr int wg_stage_bytes = (tc_bm + tc_bn) * tc_bk;     // 32 KiB: A's 128 rows, then B's
constexpr int wg_smem = wg_stages * wg_stage_bytes + 1024;  // + room to start the stages on 1024 bytes

// wgmma's shared-memory matrix descriptor of a K-major operand in rows of 128 bytes, 128-byte
// swizzle (PTX ISA, "Matrix Descriptor Format"): start address / 16 in bits 0-13; the leading
// dimension's offset, which swizzled K-major layouts do not use, 1 (bits 16-29); 1024 bytes / 16
// between groups of 8 rows (bits 32-45); base offset 0, the stage being 1024-aligned (bits 49-51);
// swizzle mode 1 = 128 bytes (bits 62-63). A k32 step of K within the rows is +32 bytes of start.
__device__ inline uint64_t wgmma_desc(uint32_t addr) {
    return uint64_t((addr & 0x3ffffu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP8KIT_WGMMA_SM90A 1
#endif

__device__ inline void wgmma_fence() {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void wgmma_commit() {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most `pending` of the warpgroup's committed wgmma groups are still running.
template <int pending>
__device__ inline void wgmma_wait() {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
#endif
}
// Shared memory written through the generic proxy (cp.async) that wgmma (the async proxy) reads
// next: each writing thread fences after its writes complete, before the barrier.
__device__ inline void fence_proxy_async() {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving reads or writes of the accumulators across wgmma's asynchronous
// window (the asm statements order among themselves, not with plain register use).
__device__ inline void wgmma_hold(float (&d)[64]) {
#pragma unroll
    for (int e = 0; e < 64; ++e) asm volatile("" : "+f"(d[e])::"memory");
}

#define FP8KIT_WGMMA_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FP8KIT_WGMMA(types)                                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32." types " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n" \
                 : FP8KIT_WGMMA_D8(0), FP8KIT_WGMMA_D8(8), FP8KIT_WGMMA_D8(16), FP8KIT_WGMMA_D8(24),         \
                   FP8KIT_WGMMA_D8(32), FP8KIT_WGMMA_D8(40), FP8KIT_WGMMA_D8(48), FP8KIT_WGMMA_D8(56)         \
                 : "l"(da), "l"(db), "r"(accumulate))

// d (+)= A . B^T over one k32 step for the warpgroup: A 64 x 32 at descriptor da, B 128 x 32 at db;
// accumulate 0 overwrites d.
template <Format FA, Format FB>
__device__ inline void wgmma_fp8(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
#ifdef FP8KIT_WGMMA_SM90A
    if constexpr (FA == Format::e4m3fn && FB == Format::e4m3fn) {
        FP8KIT_WGMMA("e4m3.e4m3");
    } else if constexpr (FA == Format::e4m3fn && FB == Format::e5m2) {
        FP8KIT_WGMMA("e4m3.e5m2");
    } else {
        static_assert(FA == Format::e5m2 && FB == Format::e4m3fn, "two e5m2 operands are refused by core");
        FP8KIT_WGMMA("e5m2.e4m3");
    }
#else
    (void)d, (void)da, (void)db, (void)accumulate;
    __trap();  // never launched but on sm_90 (wgmma_fits)
#endif
}
#undef FP8KIT_WGMMA
#undef FP8KIT_WGMMA_D8

// What both wgmma kernels share: the thread's rows and their scales, one K block's sums, the
// promotion and the epilogue. wgmma's accumulator layout: the thread holds rows r and r + 8 of its
// warp's 16, and in each 8-column slice c columns 2 (lane % 4) and +1: d[4c + 2h + e] is row
// r + 8h, column 8c + 2 (lane % 4) + e.
struct WgmmaRows {
    int64_t i0, j0;  // the tile's first row and column of D
    int r;           // the thread's first row in the tile
    int a_at[2];     // where rows r and r + 8 start in A's scales
    int b_at;        // where the tile's columns start in B's (K groups of 128: one scale per group)
    bool one_group;

    __device__ WgmmaRows(const GemmJob& j, int wg) {
        i0 = int64_t(blockIdx.y) * tc_bm;
        j0 = int64_t(blockIdx.x) * tc_bn;
        r = wg * 64 + int(threadIdx.x % 128 / 32) * 16 + int(threadIdx.x % 32) / 4;
        for (int h = 0; h < 2; ++h) a_at[h] = int(min(i0 + r + 8 * h, j.m - 1) / j.a.group.rows * j.a.scale_cols);
        b_at = int(j0 / j.b.group.rows * j.b.scale_cols);
        one_group = j.kgroup >= j.k;
    }
    // sa * sb of K block kb for rows r and r + 8 (one group: 1, the scales come in store()).
    __device__ void scales(const GemmJob& j, int64_t kb, float (&s)[2]) const {
        s[0] = s[1] = 1.0f;
        if (one_group) return;
        const int64_t kk = kb * tc_bk;
        const float sb = scale_at(j.b, b_at + int(kk / j.b.group.cols));
        for (int h = 0; h < 2; ++h) s[h] = scale_at(j.a, a_at[h] + int(kk / j.a.group.cols)) * sb;
    }
    __device__ void promote(float (&acc)[64], const float (&part)[64], const float (&s)[2]) const {
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[e] = one_group ? acc[e] + part[e] : fmaf(part[e], s[(e % 4) / 2], acc[e]);
    }
    __device__ void store(const GemmJob& j, const float (&acc)[64]) const {
        const int lane = int(threadIdx.x % 32);
#pragma unroll
        for (int e = 0; e < 64; ++e) {
            const int64_t i = i0 + r + 8 * ((e % 4) / 2), col = j0 + 8 * (e / 4) + 2 * (lane % 4) + e % 2;
            if (i >= j.m || col >= j.n) continue;
            const float v = one_group ? acc[e] * (scale_at(j.a, a_at[(e % 4) / 2]) *
                                                  scale_at(j.b, int(col / j.b.group.rows * j.b.scale_cols)))
                                      : acc[e];
            epilogue_store(j, i, col, j.alpha * v);
        }
    }
};

// part = the warpgroup's 64 rows of A times B^T over one K block (4 wgmma k32) of the stage at
// `stage` (A's 128 rows, then B's), waited for. The accumulators are touched only outside the
// arrive..wait window: ptxas otherwise waits for every wgmma before issuing the next (its info
// C7514), which a version promoting block kb - 1 while block kb ran (wgmma.wait_group 1) did -
// 190 TFLOP/s at 8192^3.
template <Format FA, Format FB>
__device__ inline void wgmma_k_block(float (&part)[64], uint32_t stage, int wg) {
    const uint32_t sa = stage + wg * 64 * tc_bk, sb = stage + tc_bm * tc_bk;
    wgmma_hold(part);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < tc_bk / 32; ++ks) wgmma_fp8<FA, FB>(part, wgmma_desc(sa + ks * 32), wgmma_desc(sb + ks * 32), ks);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold(part);
}

// A 128 x 128 tile of D per block of 2 warpgroups (see above); K blocks through a 5-stage cp.async
// pipeline, 4 blocks ahead, every thread loading.
template <Format FA, Format FB>
__global__ void __launch_bounds__(wg_threads, 1) gemm_wgmma_kernel(GemmJob j) {
    extern __shared__ uint8_t smem[];
    const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
    const int64_t kblocks = (j.k + tc_bk - 1) / tc_bk;
    const WgmmaRows t(j, int(threadIdx.x / 128));
    const StageLoader<wg_threads> loader(j, t.i0, t.j0);
    const auto stage = [&](int64_t kb) { return sbase + uint32_t(kb % wg_stages) * wg_stage_bytes; };
    float acc[64] = {}, part[64];
    for (int64_t kb = 0; kb < wg_stages - 1; ++kb) {
        if (kb < kblocks) loader.load(stage(kb), kb, j.k, j);
        cp_async_commit();
    }
    for (int64_t kb = 0; kb < kblocks; ++kb) {
        float s[2];
        t.scales(j, kb, s);  // read now, used after the wgmma: their latency hidden
        cp_async_wait<wg_stages - 2>();
        fence_proxy_async();
        __syncthreads();  // block kb is in; every warpgroup is done with block kb - 1
        if (kb + wg_stages - 1 < kblocks) loader.load(stage(kb + wg_stages - 1), kb + wg_stages - 1, j.k, j);
        cp_async_commit();
        wgmma_k_block<FA, FB>(part, stage(kb), int(threadIdx.x / 128));
        t.promote(acc, part, s);
    }
    cp_async_wait<0>();
    t.store(j, acc);
}

// ---- the same with TMA loads (opt-in: FP8KIT_CUDA_WGMMA=tma; written without a GPU at hand) ----
//
// Why: the cp.async kernel above ran at 0.13-0.20x cuBLASLt on an H200, about one memory latency
// per K block (docs/PERF.md). cp.async writes shared memory through the generic proxy, so each
// thread fences towards the async proxy (wgmma's) every block, and that fence is the suspect: it
// may wait for the thread's copies of the later stages too. The copy engine (TMA) writes through
// the async proxy - no fence - and signals an mbarrier when a stage is in: a producer thread keeps
// 6 stages in flight while the two math warpgroups (DeepGEMM's layout) each wait on a stage's
// "full" barrier, run its wgmma and arrive on its "empty" one. The 128 x 128-byte boxes arrive in
// the 128-byte swizzle the descriptors name, zero-filled past m, n and k.
constexpr int tma_stages = 6, tma_threads = 384;  // 2 math warpgroups, then the producer's
constexpr int tma_smem = tma_stages * wg_stage_bytes + 1024 + 2 * tma_stages * 8;

__device__ inline void mbar_init(uint32_t bar, uint32_t count) {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ inline void mbar_arrive(uint32_t bar) {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Arrives and adds `bytes` to the transactions the current phase waits for.
__device__ inline void mbar_expect(uint32_t bar, uint32_t bytes) {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Waits until the phase of parity `parity` has completed.
__device__ inline void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef FP8KIT_WGMMA_SM90A
    uint32_t done = 0;
    while (done == 0) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    }
#else
    (void)bar, (void)parity;
#endif
}
// The box at (x bytes of K, y rows) of the operand `map` describes, into shared memory at dst;
// its bytes complete a transaction of `bar`.
__device__ inline void tma_load(uint32_t dst, const CUtensorMap& map, int x, int y, uint32_t bar) {
#ifdef FP8KIT_WGMMA_SM90A
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(&map)), "r"(x), "r"(y), "r"(bar)
                 : "memory");
#else
    (void)dst, (void)map, (void)x, (void)y, (void)bar;
#endif
}

template <Format FA, Format FB>
__global__ void __launch_bounds__(tma_threads, 1)
    gemm_wgmma_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b, GemmJob j) {
#ifndef FP8KIT_WGMMA_SM90A
    __trap();  // never launched but on sm_90 (wgmma_fits); the helpers below are empty there
#endif
    extern __shared__ uint8_t smem[];
    const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
    const uint32_t full = sbase + tma_stages * wg_stage_bytes, empty = full + 8 * tma_stages;  // 8-byte mbarriers
    const auto stage = [&](int64_t kb) { return sbase + uint32_t(kb % tma_stages) * wg_stage_bytes; };
    // K block kb uses its stage for the (kb / stages)-th time: that round's phase of the stage's barriers.
    const auto round = [](int64_t kb) { return uint32_t(kb / tma_stages); };
    const int64_t kblocks = (j.k + tc_bk - 1) / tc_bk;
    const int wg = int(threadIdx.x / 128);
    if (threadIdx.x == 0) {
        for (int s = 0; s < tma_stages; ++s) {
            mbar_init(full + 8 * s, 1);   // the producer's arrive, with the stage's bytes
            mbar_init(empty + 8 * s, 2);  // one arrive per math warpgroup
        }
        fence_proxy_async();  // the barriers' first state, as the copy engine sees them
    }
    __syncthreads();
    if (wg == 2) {  // the producer: one thread issues both tiles of every K block
#ifdef FP8KIT_WGMMA_SM90A
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");  // registers to the math warpgroups
#endif
        if (threadIdx.x == 2 * 128) {
            const int i0 = int(blockIdx.y) * tc_bm, j0 = int(blockIdx.x) * tc_bn;
            for (int64_t kb = 0; kb < kblocks; ++kb) {
                const uint32_t s = uint32_t(kb % tma_stages);
                if (kb >= tma_stages) mbar_wait(empty + 8 * s, (round(kb) - 1) & 1);  // both warpgroups done with it
                mbar_expect(full + 8 * s, wg_stage_bytes);
                tma_load(stage(kb), map_a, int(kb * tc_bk), i0, full + 8 * s);
                tma_load(stage(kb) + tc_bm * tc_bk, map_b, int(kb * tc_bk), j0, full + 8 * s);
            }
        }
    } else {  // the math warpgroups
#ifdef FP8KIT_WGMMA_SM90A
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");  // 2 x 128 x 232 + 128 x 40 <= 64K
#endif
        const WgmmaRows t(j, wg);
        float acc[64] = {}, part[64];
        for (int64_t kb = 0; kb < kblocks; ++kb) {
            const uint32_t s = uint32_t(kb % tma_stages);
            float sc[2];
            t.scales(j, kb, sc);
            mbar_wait(full + 8 * s, round(kb) & 1);
            wgmma_k_block<FA, FB>(part, stage(kb), wg);
            if (threadIdx.x % 128 == 0) mbar_arrive(empty + 8 * s);  // this warpgroup is done reading the stage
            t.promote(acc, part, sc);
        }
        t.store(j, acc);
    }
}

bool tensor_core_format(Format f) { return f == Format::e4m3fn || f == Format::e5m2; }

// The compute capability (major * 10 + minor) of the device, asked once.
int compute_capability() {
    static const int cc = [] {
        int dev = 0, major = 0, minor = 0;
        FP8KIT_CUDA_CHECK(cudaGetDevice(&dev));
        FP8KIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        FP8KIT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        return major * 10 + minor;
    }();
    return cc;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The tensor-core kernel takes: e4m3/e5m2 operands, rows 16-byte aligned (cp.async), K groups of a
// multiple of 32 up to 128, or all of K, on sm_89 or newer.
bool mma_fits(const GemmJob& j) {
    const bool groups_ok = j.kgroup >= j.k || (j.kgroup % 32 == 0 && j.kgroup <= 128);
    return compute_capability() >= 89 && tensor_core_format(j.a.format) && tensor_core_format(j.b.format) && groups_ok && j.k % 16 == 0 &&
           j.a.ld % 16 == 0 && j.b.ld % 16 == 0 && aligned16(j.a.data) && aligned16(j.b.data);
}

// The wgmma kernel takes what the mma.sync kernel takes, on sm_90 (its code is sm_90a's), with K
// groups of exactly 128 whose B scales stay the same over each 128 columns of a tile, or one group.
bool wgmma_fits(const GemmJob& j) {
    const bool b_uniform = j.b.group.rows % tc_bn == 0 || j.b.group.rows >= j.n;
    return compute_capability() == 90 && mma_fits(j) && (j.kgroup >= j.k || (j.kgroup == tc_bk && b_uniform));
}

// FP8KIT_CUDA_WGMMA: how the wgmma kernel loads its stages - "cp.async" (the default, measured) or
// "tma" (the copy engine; written ahead of a GPU, to be measured). Read once per process (the tests
// and the device check set it from outside); any other value is an error at every GEMM (a throwing
// initializer runs again on the next call).
bool wgmma_tma() {
    static const bool tma = [] {
        const char* env = std::getenv("FP8KIT_CUDA_WGMMA");
        if (env == nullptr || *env == '\0' || std::string_view(env) == "cp.async") return false;
        if (std::string_view(env) == "tma") return true;
        throw Error("FP8KIT_CUDA_WGMMA=" + std::string(env) + " is not a way the wgmma kernel loads, expected cp.async or tma");
    }();
    return tma;
}

// cuTensorMapEncodeTiled, a driver function, through the runtime's entry point (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        FP8KIT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || p == nullptr) throw Error("fp8kit cuda: the driver has no cuTensorMapEncodeTiled");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// The copy engine's map of an operand ([rows, k] bytes, rows ld apart; 16-byte aligned, ld a
// multiple of 16: mma_fits): boxes of 128 bytes of K x 128 rows in the 128-byte swizzle, zeros
// past the edges.
CUtensorMap tile_map(const GemmOperand& op) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {cuuint64_t(op.k), cuuint64_t(op.rows)}, strides[1] = {cuuint64_t(op.ld)};
    const cuuint32_t box[2] = {tc_bk, tc_bm}, steps[2] = {1, 1};
    const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(op.data), dims, strides, box,
                                      steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) throw Error("fp8kit cuda: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")");
    return map;
}

template <Format FA, Format FB>
void launch_wgmma(const GemmJob& j, cudaStream_t s, bool tma) {
    const dim3 grid(unsigned((j.n + tc_bn - 1) / tc_bn), unsigned((j.m + tc_bm - 1) / tc_bm));
    if (tma) {
        auto kernel = gemm_wgmma_tma_kernel<FA, FB>;
        FP8KIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, tma_smem));
        kernel<<<grid, tma_threads, tma_smem, s>>>(tile_map(j.a), tile_map(j.b), j);
        check_launch("gemm_wgmma_tma_kernel");
        return;
    }
    auto kernel = gemm_wgmma_kernel<FA, FB>;
    FP8KIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_smem));
    kernel<<<grid, wg_threads, wg_smem, s>>>(j);
    check_launch("gemm_wgmma_kernel");
}

template <Format FA, Format FB>
void launch_mma(const GemmJob& j, cudaStream_t s) {
    auto kernel = gemm_mma_kernel<FA, FB>;
    FP8KIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, tc_smem));
    const int steps = j.kgroup >= j.k ? tc_bk / 32 : int(j.kgroup / 32);
    const dim3 grid(unsigned((j.n + tc_bn - 1) / tc_bn), unsigned((j.m + tc_bm - 1) / tc_bm));
    kernel<<<grid, tc_threads, tc_smem, s>>>(j, steps);
    check_launch("gemm_mma_kernel");
}

// ---- cuBLASLt: tensor scaling of both operands, a plain epilogue ----

cudaDataType_t lt_type(Format f) { return f == Format::e4m3fn ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
cudaDataType_t lt_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F; }

// How cuBLASLt reads each operand's scales (fp8kit's scale_inv layouts; the exceptions: A's 1x128
// scales, transposed for it - cuBLASLt reads them M-major, [k / 128][m] - and B's 128x128 scales,
// whose rows of K blocks it reads with a leading dimension rounded up to a multiple of 4).
enum class LtScales { none, tensor, row, block };

// The scalings cuBLASLt FP8 takes on Hopper and Ada, with a plain epilogue: tensor x tensor, row x
// row (its outer-vector scales), block 1x128 x 128x128 (its VEC128 and BLK128x128 scales; K a
// multiple of 128). Dimensions multiples of 16, rows contiguous and 16-byte aligned.
LtScales lt_scales(const GemmJob& j) {
    if (!tensor_core_format(j.a.format) || !tensor_core_format(j.b.format) || j.a.e8m0 || j.b.e8m0 ||
        j.c.data != nullptr || j.bias != nullptr || j.activation != Activation::none || j.m % 16 != 0 ||
        j.n % 16 != 0 || j.k % 16 != 0 || j.a.ld != j.k || j.b.ld != j.k || !aligned16(j.a.data) ||
        !aligned16(j.b.data) || !aligned16(j.out) || !mma_fits(j)) {
        return LtScales::none;
    }
    const GroupShape ga = j.a.group, gb = j.b.group;
    if (ga.rows >= j.m && ga.cols >= j.k && gb.rows >= j.n && gb.cols >= j.k) return LtScales::tensor;
    if (ga.rows == 1 && ga.cols >= j.k && gb.rows == 1 && gb.cols >= j.k) return LtScales::row;
    if (ga == GroupShape{1, 128} && gb == GroupShape{128, 128} && j.k % 128 == 0) return LtScales::block;
    return LtScales::none;
}

// scale_t[kb][i] = scale[i][kb]: A's 1x128 scales as cuBLASLt's VEC128 reads them.
__global__ void transpose_scales_kernel(const float* scale, int64_t rows, int64_t cols, float* scale_t) {
    for (int64_t e = grid_first(); e < rows * cols; e += grid_step()) {
        scale_t[(e % cols) * rows + e / cols] = scale[e];
    }
}

// D^T [n, m] (column-major: D row-major) = op(B)^T-layout x A: cuBLASLt's "TN" with B as its A.
void launch_lt(const GemmJob& j, LtScales scales, cudaStream_t s) {
    static LtAlgos<std::tuple<int64_t, int64_t, int64_t, int, int, int, int>> algos;
    LtCall call;
    FP8KIT_LT_CHECK(cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    FP8KIT_LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    FP8KIT_LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    const void* scale_b = j.b.scale_inv;  // cuBLASLt's A is fp8kit's B
    const void* scale_a = j.a.scale_inv;
    std::shared_ptr<std::byte> a_scales_t, b_scales_padded;  // stream-ordered: freed after the GEMM
    int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    if (scales == LtScales::row) {
        mode_a = mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    } else if (scales == LtScales::block) {
        mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        const int64_t kb = j.k / 128;
        a_scales_t = allocate(size_t(j.m * kb) * sizeof(float));
        transpose_scales_kernel<<<blocks_for(j.m * kb, 256, 4096), 256, 0, s>>>(
            static_cast<const float*>(j.a.scale_inv), j.m, kb, reinterpret_cast<float*>(a_scales_t.get()));
        check_launch("transpose_scales_kernel");
        scale_a = a_scales_t.get();
        const int64_t kb4 = (kb + 3) / 4 * 4, nb = (j.n + 127) / 128;
        if (kb4 != kb) {  // B's scale rows padded to kb4 (seen on an H200: unpadded, D was wrong past N = 128)
            b_scales_padded = allocate(size_t(nb * kb4) * sizeof(float));
            FP8KIT_CUDA_CHECK(cudaMemcpy2DAsync(b_scales_padded.get(), size_t(kb4) * sizeof(float), j.b.scale_inv,
                                                size_t(kb) * sizeof(float), size_t(kb) * sizeof(float), size_t(nb),
                                                cudaMemcpyDeviceToDevice, s));
            scale_b = b_scales_padded.get();
        }
    }
    FP8KIT_LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_b, sizeof(mode_b)));
    FP8KIT_LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_a, sizeof(mode_a)));
    FP8KIT_LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_b, sizeof(scale_b)));
    FP8KIT_LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_a, sizeof(scale_a)));
    FP8KIT_LT_CHECK(cublasLtMatrixLayoutCreate(&call.a, lt_type(j.b.format), uint64_t(j.k), uint64_t(j.n), j.b.ld));
    FP8KIT_LT_CHECK(cublasLtMatrixLayoutCreate(&call.b, lt_type(j.a.format), uint64_t(j.k), uint64_t(j.m), j.a.ld));
    FP8KIT_LT_CHECK(cublasLtMatrixLayoutCreate(&call.d, lt_type(j.out_dtype), uint64_t(j.n), uint64_t(j.m), j.n));
    const auto key = std::make_tuple(j.m, j.n, j.k, int(j.a.format), int(j.b.format), int(j.out_dtype), int(scales));
    const cublasLtMatmulAlgo_t algo = lt_algo(algos, key, call, j.b.data, j.a.data, j.out, "this FP8 GEMM", j.m, j.n, j.k);
    const float alpha = j.alpha, beta = 0.0f;
    Lt& l = lt();
    FP8KIT_LT_CHECK(cublasLtMatmul(l.handle, call.desc, &alpha, j.b.data, call.a, j.a.data, call.b, &beta, j.out, call.d,
                                   j.out, call.d, &algo, l.workspace, l.workspace_bytes, s));
}

}  // namespace

std::shared_ptr<const void> pack_weight(const ExecContext&, const GemmOperand&, int64_t, size_t* bytes) {
    *bytes = 0;  // the kernels read B as it is ([n, k], K contiguous)
    return nullptr;
}

void gemm(GemmJob& job) {
    const cudaStream_t s = stream_of(job.ctx);
    const bool tma = wgmma_tma();  // checked on every GPU, used on sm_90
    std::shared_ptr<std::byte> a_codes;  // the fused cast's A, quantized here
    if (job.fuse != nullptr && job.k == 0) {
        zero(job.fuse->amax, sizeof(float));  // A is [m, 0]: nothing to cast
    } else if (job.fuse != nullptr) {
        a_codes = allocate(size_t(job.m * job.k));
        detail::QuantizeJob q = *job.fuse;
        q.data = reinterpret_cast<uint8_t*>(a_codes.get());
        quantize(q);
        job.a.data = q.data;
        job.a.ld = job.k;
    }
    const LtScales lt = job.k > 0 ? lt_scales(job) : LtScales::none;
    if (lt != LtScales::none) {
        launch_lt(job, lt, s);
    } else if (job.k > 0 && mma_fits(job)) {
        const bool wgmma = wgmma_fits(job);
        const auto launch = [&](auto fa, auto fb) {
            constexpr Format FA = decltype(fa)::value, FB = decltype(fb)::value;
            wgmma ? launch_wgmma<FA, FB>(job, s, tma) : launch_mma<FA, FB>(job, s);
        };
        using E4 = std::integral_constant<Format, Format::e4m3fn>;
        using E5 = std::integral_constant<Format, Format::e5m2>;
        switch (job.a.format == Format::e5m2 ? 2 : job.b.format == Format::e5m2 ? 1 : 0) {
            case 0: launch(E4{}, E4{}); break;
            case 1: launch(E4{}, E5{}); break;
            default: launch(E5{}, E4{}); break;
        }
    } else {
        const dim3 grid(unsigned((job.n + simt_tile - 1) / simt_tile), unsigned((job.m + simt_tile - 1) / simt_tile));
        gemm_simt_kernel<<<grid, 256, 0, s>>>(job);
        check_launch("gemm_simt_kernel");
    }
}

}  // namespace fp8kit::cuda
