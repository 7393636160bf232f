// src/nn/matmul_kernel.hpp: the high-precision GEMM of src/nn (float32 for training, float64 for
// the tests), written as plain C++ that g++ / clang -O3 vectorize: both operands are packed so the
// inner loop reads contiguous memory, and each task keeps a 4 x 16 tile of C in registers
// (8 AVX2 registers for float) over the whole K - every C element is one sum in k order, so the
// result does not depend on threads or tiling. Included by matmul.cpp (portable flags) and
// matmul_avx2.cpp (-mavx2 -mfma); internal linkage, so the two copies never merge at link time.
// Checked against a float64 triple loop on odd shapes in tests/nn/test_ops.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "nn/ops.hpp"

namespace fp8kit::nn::ops {
namespace {

constexpr int64_t tile_rows = 4, tile_cols = 16;

template <class T>
void matmul_kernel(T* c, const T* a, Trans ta, const T* b, Trans tb, int64_t m, int64_t n, int64_t k,
                   bool accumulate) {
    if (m <= 0 || n <= 0) return;
    // A as [m, k] row-major (a transposed copy when A is stored [k, m]).
    std::vector<T> a_packed;
    if (ta == Trans::yes) {
        a_packed.resize(size_t(m * k));
        for (int64_t kk = 0; kk < k; ++kk)
            for (int64_t i = 0; i < m; ++i) a_packed[size_t(i * k + kk)] = a[kk * m + i];
        a = a_packed.data();
    }
    // B as panels of 16 columns: panel p holds B[:, 16p .. 16p+15] as [k][16], zero-padded at the
    // right edge so the kernel always runs full tiles and stores only the valid columns.
    const int64_t panels = (n + tile_cols - 1) / tile_cols;
    std::vector<T> bp(size_t(panels * k * tile_cols), T(0));
#pragma omp parallel for schedule(static) if (k * n > 4 * parallel_min_work)
    for (int64_t p = 0; p < panels; ++p) {
        const int64_t cols = std::min(tile_cols, n - p * tile_cols);
        T* dst = bp.data() + p * k * tile_cols;
        for (int64_t kk = 0; kk < k; ++kk)
            for (int64_t j = 0; j < cols; ++j) {
                const int64_t col = p * tile_cols + j;
                dst[kk * tile_cols + j] = tb == Trans::no ? b[kk * n + col] : b[col * k + kk];
            }
    }
    const int64_t row_tiles = (m + tile_rows - 1) / tile_rows;
    const int64_t tasks = row_tiles * panels;
#pragma omp parallel for schedule(static) if (m * n * k > 32 * parallel_min_work)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t i0 = (task / panels) * tile_rows, p = task % panels;
        const T* panel = bp.data() + p * k * tile_cols;
        // Rows past m repeat the last row (computed, never stored): no branch in the loop.
        const T* arow[tile_rows];
        for (int64_t r = 0; r < tile_rows; ++r) arow[r] = a + std::min(i0 + r, m - 1) * k;
        T acc[tile_rows][tile_cols] = {};
        for (int64_t kk = 0; kk < k; ++kk) {
            const T* bv = panel + kk * tile_cols;
            for (int64_t r = 0; r < tile_rows; ++r) {
                const T av = arow[r][kk];
                for (int64_t j = 0; j < tile_cols; ++j) acc[r][j] += av * bv[j];
            }
        }
        const int64_t rows = std::min(tile_rows, m - i0), cols = std::min(tile_cols, n - p * tile_cols);
        for (int64_t r = 0; r < rows; ++r) {
            T* crow = c + (i0 + r) * n + p * tile_cols;
            for (int64_t j = 0; j < cols; ++j) crow[j] = accumulate ? crow[j] + acc[r][j] : acc[r][j];
        }
    }
}

}  // namespace
}  // namespace fp8kit::nn::ops
