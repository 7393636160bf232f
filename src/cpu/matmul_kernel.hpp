// src/cpu/matmul_kernel.hpp: the cpu backend's high-precision matmul kernel (float32 for the
// layer ops, float64 for the finite-difference checks), written as plain C++ that g++ / clang -O3
// vectorize: both operands are packed so the inner loop reads contiguous memory, and each task
// keeps a 4 x 16 tile of C in registers (8 AVX2 registers for float) over the whole K - every C
// element is one sum in k order, so the result does not depend on threads or tiling. The
// portable kernel table's float32 matmul and every ISA's float64 one (src/cpu/matmul.cpp); on
// AVX2 the float32 matmul runs on the FP8 GEMM's 6x16 tile kernel (src/cpu/gemm_avx2.cpp), the
// same sum in the same order with fused multiply-adds. Checked against the reference backend on
// odd shapes by tests/ops/test_matmul.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {
namespace {

constexpr int64_t matmul_tile_rows = 4, matmul_tile_cols = 16;

// The operands as the matmul kernels read them (this one and the AVX2 tile kernel's in
// src/cpu/gemm_avx2.cpp). A as [m, k] rows: a itself, or a transposed copy in `keep` when it is
// stored [k, m] (ta).
template <class T>
const T* matmul_rows_of_a(const T* a, bool ta, int64_t m, int64_t k, std::vector<T>& keep) {
    if (!ta) return a;
    keep.resize(size_t(m * k));
    for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t i = 0; i < m; ++i) keep[size_t(i * k + kk)] = a[kk * m + i];
    return keep.data();
}

// B (stored [k, n], or [n, k] when tb) as panels of 16 columns: panel p holds B[:, 16p .. 16p+15]
// as [k][16], zero-padded at the right edge so a kernel always runs full tiles and stores only the
// valid columns.
template <class T>
std::vector<T> matmul_panels_of_b(const T* b, bool tb, int64_t n, int64_t k) {
    const int64_t panels = (n + matmul_tile_cols - 1) / matmul_tile_cols;
    std::vector<T> bp(size_t(panels * k * matmul_tile_cols), T(0));
#pragma omp parallel for schedule(static) if (k * n > 4 * parallel_min_work)
    for (int64_t p = 0; p < panels; ++p) {
        const int64_t cols = std::min(matmul_tile_cols, n - p * matmul_tile_cols);
        T* dst = bp.data() + p * k * matmul_tile_cols;
        for (int64_t kk = 0; kk < k; ++kk)
            for (int64_t j = 0; j < cols; ++j) {
                const int64_t col = p * matmul_tile_cols + j;
                dst[kk * matmul_tile_cols + j] = tb ? b[col * k + kk] : b[kk * n + col];
            }
    }
    return bp;
}

// c[m, n] (+)= op(a)[m, k] . op(b)[k, n]; a stored [m, k] or [k, m] (ta), b [k, n] or [n, k] (tb).
template <class T>
void matmul_kernel(T* c, const T* a, bool ta, const T* b, bool tb, int64_t m, int64_t n, int64_t k, bool accumulate) {
    if (m <= 0 || n <= 0) return;
    std::vector<T> a_packed;
    a = matmul_rows_of_a(a, ta, m, k, a_packed);
    const std::vector<T> bp = matmul_panels_of_b(b, tb, n, k);
    const int64_t panels = (n + matmul_tile_cols - 1) / matmul_tile_cols;
    const int64_t row_tiles = (m + matmul_tile_rows - 1) / matmul_tile_rows;
    const int64_t tasks = row_tiles * panels;
#pragma omp parallel for schedule(static) if (m * n * k > 32 * parallel_min_work)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t i0 = (task / panels) * matmul_tile_rows, p = task % panels;
        const T* panel = bp.data() + p * k * matmul_tile_cols;
        // Rows past m repeat the last row (computed, never stored): no branch in the loop.
        const T* arow[matmul_tile_rows];
        for (int64_t r = 0; r < matmul_tile_rows; ++r) arow[r] = a + std::min(i0 + r, m - 1) * k;
        T acc[matmul_tile_rows][matmul_tile_cols] = {};
        for (int64_t kk = 0; kk < k; ++kk) {
            const T* bv = panel + kk * matmul_tile_cols;
            for (int64_t r = 0; r < matmul_tile_rows; ++r) {
                const T av = arow[r][kk];
                for (int64_t j = 0; j < matmul_tile_cols; ++j) acc[r][j] += av * bv[j];
            }
        }
        const int64_t rows = std::min(matmul_tile_rows, m - i0), cols = std::min(matmul_tile_cols, n - p * matmul_tile_cols);
        for (int64_t r = 0; r < rows; ++r) {
            T* crow = c + (i0 + r) * n + p * matmul_tile_cols;
            for (int64_t j = 0; j < cols; ++j) crow[j] = accumulate ? crow[j] + acc[r][j] : acc[r][j];
        }
    }
}

}  // namespace
}  // namespace fp8kit::cpu
