// src/cpu/gelu.cpp: the cpu backend's GELU, tanh form (GPT-2; torch gelu(approximate="tanh")),
// and its derivative, elementwise in the tensor's precision (float32: float32 tanh), split over
// OpenMP threads. Checked against the reference backend by tests/ops/test_gelu.cpp.
#include <cmath>
#include <numbers>

#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void gelu_fwd(const detail::GeluJob& j) {
    T* out = static_cast<T*>(j.out);
    const T* inp = static_cast<const T*>(j.inp);
    const T s = T(std::sqrt(2.0 / std::numbers::pi));
#pragma omp parallel for schedule(static) if (j.n > parallel_min_work)
    for (int64_t i = 0; i < j.n; ++i) {
        const T x = inp[i];
        out[i] = T(0.5) * x * (T(1) + std::tanh(s * (x + T(0.044715) * x * x * x)));
    }
}

template <class T>
void gelu_bwd(const detail::GeluJob& j) {
    T* dinp = static_cast<T*>(j.out);
    const T* inp = static_cast<const T*>(j.inp);
    const T* dout = static_cast<const T*>(j.dout);
    const T s = T(std::sqrt(2.0 / std::numbers::pi));
#pragma omp parallel for schedule(static) if (j.n > parallel_min_work)
    for (int64_t i = 0; i < j.n; ++i) {
        const T x = inp[i];
        const T th = std::tanh(s * (x + T(0.044715) * x * x * x));
        const T sech2 = T(1) - th * th;
        dinp[i] = (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * s * (T(1) + T(3 * 0.044715) * x * x)) * dout[i];
    }
}

}  // namespace

void gelu_forward(const detail::GeluJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { gelu_fwd<T>(j); });
}
void gelu_backward(const detail::GeluJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { gelu_bwd<T>(j); });
}

}  // namespace fp8kit::cpu
