// src/nn/matmul_avx2.cpp: the float32 GEMM of src/nn (matmul_kernel.hpp) compiled with AVX2 + FMA,
// chosen by matmul.cpp when the CPU has them. Same numerics as the portable build except that
// the compiler may fuse multiply-adds (each product-sum rounded once instead of twice); checked
// with the portable one against float64 in tests/nn/test_ops.cpp.
#include "nn/matmul_kernel.hpp"

namespace fp8kit::nn::ops {

void matmul_f32_avx2(float* c, const float* a, Trans ta, const float* b, Trans tb, int64_t m, int64_t n, int64_t k,
                     bool accumulate) {
    matmul_kernel(c, a, ta, b, tb, m, n, k, accumulate);
}

}  // namespace fp8kit::nn::ops
