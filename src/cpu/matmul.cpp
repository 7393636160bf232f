// src/cpu/matmul.cpp: the cpu backend's f32/bf16 matmul (the layer ops' Linear) and Linear's bias
// gradient. float32 runs on the GEMM engine's kernel table (src/cpu/gemm_kernels.hpp: on AVX2
// the FP8 tiles' float32 kernel, else the portable build of matmul_kernel.hpp); bf16
// operands are widened to float32 first (exact), float64 runs the portable build. The bias is
// added after the product and the bias gradient sums rows in order, on one thread.
// Checked against the reference backend by tests/ops/test_matmul.cpp, on every ISA path.
#include <vector>

#include "core/ops.hpp"
#include "cpu/gemm_kernels.hpp"
#include "cpu/matmul_kernel.hpp"
#include "fp8kit/half.hpp"

namespace fp8kit::cpu {

void matmul_f32_portable(float* c, const float* a, bool ta, const float* b, bool tb, int64_t m, int64_t n, int64_t k,
                         bool accumulate) {
    matmul_kernel(c, a, ta, b, tb, m, n, k, accumulate);
}

namespace {

// A float32 view of an f32 or bf16 operand of `count` elements (`keep` holds the widened copy).
const float* as_f32(const void* p, DType dtype, int64_t count, std::vector<float>& keep) {
    if (dtype == DType::f32) return static_cast<const float*>(p);
    keep.resize(size_t(count));
    const bf16* src = static_cast<const bf16*>(p);
    for (int64_t i = 0; i < count; ++i) keep[size_t(i)] = float(src[i]);
    return keep.data();
}

template <class T>
void add_bias(const detail::MatmulJob& j) {
    T* out = static_cast<T*>(j.out);
    const T* bias = static_cast<const T*>(j.bias);
    for (int64_t r = 0; r < j.m; ++r)
        for (int64_t o = 0; o < j.n; ++o) out[r * j.n + o] += bias[o];
}

template <class T>
void bias_grad_rows(const detail::BiasGradJob& j) {
    T* dbias = static_cast<T*>(j.dbias);
    const T* dout = static_cast<const T*>(j.dout);
    for (int64_t r = 0; r < j.rows; ++r)
        for (int64_t o = 0; o < j.cols; ++o) dbias[o] += dout[r * j.cols + o];
}

}  // namespace

void matmul(const detail::MatmulJob& j) {
    if (j.dtype == DType::f64) {
        matmul_kernel(static_cast<double*>(j.out), static_cast<const double*>(j.a), j.ta, static_cast<const double*>(j.b),
                      j.tb, j.m, j.n, j.k, j.accumulate);
        if (j.bias != nullptr) add_bias<double>(j);
        return;
    }
    std::vector<float> wa, wb;
    const float* a = as_f32(j.a, j.a_dtype, j.m * j.k, wa);
    const float* b = as_f32(j.b, j.b_dtype, j.k * j.n, wb);
    gemm_kernels().matmul_f32(static_cast<float*>(j.out), a, j.ta, b, j.tb, j.m, j.n, j.k, j.accumulate);
    if (j.bias != nullptr) add_bias<float>(j);
}

void bias_grad(const detail::BiasGradJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { bias_grad_rows<T>(j); });
}

}  // namespace fp8kit::cpu
