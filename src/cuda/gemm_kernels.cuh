// src/cuda/gemm_kernels.cuh: what the cuda backend's GEMM engines share - the scale of an
// operand's element, the epilogue and store of an output element, the tensor-core kernels' tile,
// its swizzled shared-memory rows and the cp.async stage loads - and each engine's entry points:
// the decode rows' kernel (src/cuda/gemm_gemv.cu), cuBLASLt (gemm_cublaslt.cu), mma.sync
// (gemm_mma.cu), wgmma (gemm_wgmma.cu) and the CUDA cores (gemm_simt.cu), chosen per job by gemm()
// in src/cuda/gemm.cu.
// Checked through them by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound)
// when a GPU is present.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/math.hpp"
#include "cuda/common.cuh"

namespace fp8kit::cuda {

using detail::GemmJob;
using detail::GemmOperand;

// ---- every engine's kernels: scales and the epilogue ----

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

// ---- the tensor-core kernels: mma.sync, and the tile and stage loads of mma.sync and wgmma ----

// D += A B^T for one m16n8k32 tile: a (4 registers of 4 codes) the 16 x 32 row-major operand, b
// (2 registers) the 32 x 8 column-major one, d the 16 x 8 float32 tile (PTX ISA's fragment layouts).
// The FP8 matrix instructions have no CUDA C++ intrinsic, so they are reached through PTX (device
// code only; nvcc assembles it for every host platform).
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

inline bool tensor_core_format(Format f) { return f == Format::e4m3fn || f == Format::e5m2; }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The compute capability (major * 10 + minor) of the device, asked once.
inline int compute_capability() {
    static const int cc = [] {
        int dev = 0, major = 0, minor = 0;
        FP8KIT_CUDA_CHECK(cudaGetDevice(&dev));
        FP8KIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        FP8KIT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        return major * 10 + minor;
    }();
    return cc;
}

// Calls fn(FA{}, FB{}) with the job's operand formats as std::integral_constant<Format, ...> -
// e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3 (core refuses two e5m2 operands) - for the tensor-core
// kernels, which are templates on them.
template <class Fn>
void with_tensor_core_formats(const GemmJob& j, Fn&& fn) {
    using E4 = std::integral_constant<Format, Format::e4m3fn>;
    using E5 = std::integral_constant<Format, Format::e5m2>;
    switch (j.a.format == Format::e5m2 ? 2 : j.b.format == Format::e5m2 ? 1 : 0) {
        case 0: fn(E4{}, E4{}); break;
        case 1: fn(E4{}, E5{}); break;
        default: fn(E5{}, E4{}); break;
    }
}

// ---- the engines, in the order gemm() tries them ----

// cuBLASLt (gemm_cublaslt.cu). How it reads each operand's scales (fp8kit's scale_inv layouts; the
// exceptions: A's 1x128 scales, transposed for it - cuBLASLt reads them M-major, [k / 128][m] - and
// B's 128x128 scales, whose rows of K blocks it reads with a leading dimension rounded up to a
// multiple of 4); none: a job it does not take.
enum class LtScales { none, tensor, row, block };
LtScales lt_scales(const GemmJob& j);
void launch_lt(const GemmJob& j, LtScales scales, cudaStream_t s);

// A decode step's rows (gemm_gemv.cu): e4m3 / e5m2, K a multiple of 16, rows 16-byte aligned, any
// epilogue; m <= 2 on the CUDA cores, one K group or groups of a multiple of 16 - or, with
// FP8KIT_CUDA_GEMV=mma, m <= 16 on the tensor cores (sm_89 and newer), groups of a multiple of 32.
bool gemv_fits(const GemmJob& j);
void launch_gemv(const GemmJob& j, cudaStream_t s);

// The tensor cores through mma.sync m16n8k32 (gemm_mma.cu), sm_89 and newer.
bool mma_fits(const GemmJob& j);
void launch_mma(const GemmJob& j, cudaStream_t s);

// The Hopper tensor cores through wgmma m64n128k32 (gemm_wgmma.cu), sm_90a, for jobs mma_fits
// takes; tma: stages loaded by the copy engine rather than cp.async (FP8KIT_CUDA_WGMMA, wgmma_tma).
bool wgmma_fits(const GemmJob& j);
bool wgmma_tma();
void launch_wgmma(const GemmJob& j, cudaStream_t s, bool tma);

// The CUDA cores (gemm_simt.cu): any format, any K group, any alignment.
void launch_simt(const GemmJob& j, cudaStream_t s);

}  // namespace fp8kit::cuda
