// src/cuda/gemm_wgmma.cu: the cuda GEMM on the Hopper tensor cores through wgmma m64n128k32
// (sm_90a), for K groups of 128 or one group over all of K: its stages loaded by cp.async, or by
// the copy engine (TMA) with FP8KIT_CUDA_WGMMA=tma; the tile, stage layout and numerics of the
// mma.sync kernel (src/cuda/gemm_mma.cu), which runs the jobs this one does not fit.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound; both loads)
// when a GPU is present; timed by bench/bench_gemm_cuda.cpp against cuBLASLt and torch._scaled_mm.
//
// The tensor-core instructions are reached through PTX (wgmma, cp.async, TMA, mbarrier): CUDA C++
// has no intrinsic for FP8 matrix instructions. This is device code only; nvcc assembles it for
// every host platform.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "cuda/gemm_kernels.cuh"
#include "fp8kit/error.hpp"

namespace fp8kit::cuda {

namespace {

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
void launch(const GemmJob& j, cudaStream_t s, bool tma) {
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

}  // namespace

// The wgmma kernel takes what the mma.sync kernel takes, on sm_90 (its code is sm_90a's), with K
// groups of exactly 128 whose B scales stay the same over each 128 columns of a tile, or one group.
bool wgmma_fits(const GemmJob& j) {
    const bool b_uniform = j.b.group.rows % tc_bn == 0 || j.b.group.rows >= j.n;
    return compute_capability() == 90 && mma_fits(j) && (j.kgroup >= j.k || (j.kgroup == tc_bk && b_uniform));
}

// FP8KIT_CUDA_WGMMA: how the wgmma kernel loads its stages - "cp.async" (the default, measured) or
// "tma" (the copy engine; its tests pass on an H200, its speed is not measured yet: the default
// stays until it is). Read once per process (the tests
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

void launch_wgmma(const GemmJob& j, cudaStream_t s, bool tma) {
    with_tensor_core_formats(j, [&](auto fa, auto fb) { launch<decltype(fa)::value, decltype(fb)::value>(j, s, tma); });
}

}  // namespace fp8kit::cuda
