// src/cuda/gemm_simt.cu: the cuda GEMM on the CUDA cores - any format (e4m3fnuz and e5m2fnuz,
// which the tensor cores do not take, too), any K group (narrower than 32 or not a multiple of it),
// unaligned rows and any epilogue: what gemm() (src/cuda/gemm.cu) runs when no tensor-core engine
// takes the job.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound) when a GPU is
// present.
#include "cuda/gemm_kernels.cuh"

namespace fp8kit::cuda {

namespace {

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

}  // namespace

void launch_simt(const GemmJob& j, cudaStream_t s) {
    const dim3 grid(unsigned((j.n + simt_tile - 1) / simt_tile), unsigned((j.m + simt_tile - 1) / simt_tile));
    gemm_simt_kernel<<<grid, 256, 0, s>>>(j);
    check_launch("gemm_simt_kernel");
}

}  // namespace fp8kit::cuda
