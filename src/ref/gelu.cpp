// src/ref/gelu.cpp: the reference GELU, tanh form, and its derivative - plain loops in float64
// (constants in float64), each output rounded once. The ground truth of tests/ops/test_gelu.cpp.
#include <cmath>
#include <numbers>

#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

constexpr double gelu_c = 0.044715;
const double gelu_s = std::sqrt(2.0 / std::numbers::pi);

template <class T>
void gelu_fwd(const detail::GeluJob& j) {
    const T* inp = static_cast<const T*>(j.inp);
    for (int64_t i = 0; i < j.n; ++i) {
        const double x = double(inp[i]);
        static_cast<T*>(j.out)[i] = T(0.5 * x * (1.0 + std::tanh(gelu_s * (x + gelu_c * x * x * x))));
    }
}

// d/dx 0.5 x (1 + tanh(u)) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u', u' = s (1 + 3 c x^2)
template <class T>
void gelu_bwd(const detail::GeluJob& j) {
    const T* inp = static_cast<const T*>(j.inp);
    const T* dout = static_cast<const T*>(j.dout);
    for (int64_t i = 0; i < j.n; ++i) {
        const double x = double(inp[i]);
        const double th = std::tanh(gelu_s * (x + gelu_c * x * x * x));
        const double d = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * gelu_s * (1.0 + 3.0 * gelu_c * x * x);
        static_cast<T*>(j.out)[i] = T(d * double(dout[i]));
    }
}

}  // namespace

void gelu_forward(const detail::GeluJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { gelu_fwd<T>(j); });
}
void gelu_backward(const detail::GeluJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { gelu_bwd<T>(j); });
}

}  // namespace fp8kit::ref
