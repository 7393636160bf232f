// src/nn/matmul.cpp: ops::matmul, the high-precision GEMM of src/nn (the f32 recipe, attention
// projections, the backward of non-FP8 layers): float32 on the AVX2 build of the kernel when the
// CPU has it (runtime.hpp's active_isa), else the portable build; float64 for the tests.
// Checked against a float64 triple loop in tests/nn/test_ops.cpp.
#include "fp8kit/runtime.hpp"
#include "nn/matmul_kernel.hpp"

namespace fp8kit::nn::ops {

#ifdef FP8KIT_X86_KERNELS
void matmul_f32_avx2(float* c, const float* a, Trans ta, const float* b, Trans tb, int64_t m, int64_t n, int64_t k,
                     bool accumulate);
#endif

template <class T>
void matmul(T* c, const T* a, Trans ta, const T* b, Trans tb, int64_t m, int64_t n, int64_t k, bool accumulate) {
#ifdef FP8KIT_X86_KERNELS
    if constexpr (std::is_same_v<T, float>) {
        if (active_isa() != Isa::portable) return matmul_f32_avx2(c, a, ta, b, tb, m, n, k, accumulate);
    }
#endif
    matmul_kernel(c, a, ta, b, tb, m, n, k, accumulate);
}

template void matmul(float*, const float*, Trans, const float*, Trans, int64_t, int64_t, int64_t, bool);
template void matmul(double*, const double*, Trans, const double*, Trans, int64_t, int64_t, int64_t, bool);

}  // namespace fp8kit::nn::ops
