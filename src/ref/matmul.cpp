// src/ref/matmul.cpp: the reference matmul and Linear bias gradient - plain loops, each output
// one float64 sum (bf16 operands widened exactly), rounded once: the value an ideal float32
// kernel approximates. The ground truth of tests/ops/test_matmul.cpp.
#include <vector>

#include "core/math.hpp"
#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

// Element i of an operand as a double (f32, bf16 or f64).
double element(const void* p, DType dtype, int64_t i) {
    return dtype == DType::f64 ? static_cast<const double*>(p)[i] : double(detail::load_float(p, dtype, i));
}

template <class T>
void matmul_t(const detail::MatmulJob& j) {
    T* out = static_cast<T*>(j.out);
    for (int64_t i = 0; i < j.m; ++i) {
        for (int64_t n = 0; n < j.n; ++n) {
            double sum = j.accumulate ? double(out[i * j.n + n]) : 0.0;
            for (int64_t kk = 0; kk < j.k; ++kk) {
                const double a = element(j.a, j.a_dtype, j.ta ? kk * j.m + i : i * j.k + kk);
                const double b = element(j.b, j.b_dtype, j.tb ? n * j.k + kk : kk * j.n + n);
                sum += a * b;
            }
            if (j.bias != nullptr) sum += double(static_cast<const T*>(j.bias)[n]);
            out[i * j.n + n] = T(sum);
        }
    }
}

template <class T>
void bias_grad_t(const detail::BiasGradJob& j) {
    T* dbias = static_cast<T*>(j.dbias);
    const T* dout = static_cast<const T*>(j.dout);
    for (int64_t o = 0; o < j.cols; ++o) {
        double sum = double(dbias[o]);
        for (int64_t r = 0; r < j.rows; ++r) sum += double(dout[r * j.cols + o]);
        dbias[o] = T(sum);
    }
}

}  // namespace

void matmul(const detail::MatmulJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { matmul_t<T>(j); });
}

void bias_grad(const detail::BiasGradJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { bias_grad_t<T>(j); });
}

}  // namespace fp8kit::ref
