// src/cuda/gemm_mma.cu: the cuda GEMM on the tensor cores through mma.sync m16n8k32 (sm_89 and
// sm_90a): e4m3 / e5m2 operands, K groups of 32 to 128 or all of K (block 1x128 x 128x128 with
// DeepGEMM's numerics, mx32, rowwise, any shape and epilogue) - products summed by the tensor cores
// over at most 128 of K, then promoted into a float32 accumulator with their group's scales. On
// sm_90 the wgmma kernel (src/cuda/gemm_wgmma.cu) takes the jobs it fits.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound) when a GPU is
// present; timed by bench/bench_gemm_cuda.cpp.
//
// The tensor-core instructions are reached through PTX (mma.sync, ldmatrix, cp.async): CUDA C++
// has no intrinsic for FP8 matrix instructions. This is device code only; nvcc assembles it for
// every host platform.
#include "cuda/gemm_kernels.cuh"

namespace fp8kit::cuda {

namespace {

__device__ inline void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

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

template <Format FA, Format FB>
void launch(const GemmJob& j, cudaStream_t s) {
    auto kernel = gemm_mma_kernel<FA, FB>;
    FP8KIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, tc_smem));
    const int steps = j.kgroup >= j.k ? tc_bk / 32 : int(j.kgroup / 32);
    const dim3 grid(unsigned((j.n + tc_bn - 1) / tc_bn), unsigned((j.m + tc_bm - 1) / tc_bm));
    kernel<<<grid, tc_threads, tc_smem, s>>>(j, steps);
    check_launch("gemm_mma_kernel");
}

}  // namespace

// The tensor-core kernel takes: e4m3/e5m2 operands, rows 16-byte aligned (cp.async), K groups of a
// multiple of 32 up to 128, or all of K, on sm_89 or newer.
bool mma_fits(const GemmJob& j) {
    const bool groups_ok = j.kgroup >= j.k || (j.kgroup % 32 == 0 && j.kgroup <= 128);
    return compute_capability() >= 89 && tensor_core_format(j.a.format) && tensor_core_format(j.b.format) && groups_ok && j.k % 16 == 0 &&
           j.a.ld % 16 == 0 && j.b.ld % 16 == 0 && aligned16(j.a.data) && aligned16(j.b.data);
}

void launch_mma(const GemmJob& j, cudaStream_t s) {
    with_tensor_core_formats(j, [&](auto fa, auto fb) { launch<decltype(fa)::value, decltype(fb)::value>(j, s); });
}

}  // namespace fp8kit::cuda
