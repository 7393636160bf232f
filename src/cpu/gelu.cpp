// src/cpu/gelu.cpp: the cpu backend's GELU, tanh form (GPT-2; torch gelu(approximate="tanh")),
// and its derivative, elementwise in the tensor's precision (detail::gelu / gelu_grad; float32:
// float32 tanh), split over OpenMP threads. Checked against the reference backend by
// tests/ops/test_gelu.cpp.
#include "core/math.hpp"
#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void gelu_fwd(const detail::GeluJob& j) {
    T* out = static_cast<T*>(j.out);
    const T* inp = static_cast<const T*>(j.inp);
#pragma omp parallel for schedule(static) if (j.n > parallel_min_work)
    for (int64_t i = 0; i < j.n; ++i) out[i] = detail::gelu(inp[i]);
}

template <class T>
void gelu_bwd(const detail::GeluJob& j) {
    T* dinp = static_cast<T*>(j.out);
    const T* inp = static_cast<const T*>(j.inp);
    const T* dout = static_cast<const T*>(j.dout);
#pragma omp parallel for schedule(static) if (j.n > parallel_min_work)
    for (int64_t i = 0; i < j.n; ++i) dinp[i] = detail::gelu_grad(inp[i]) * dout[i];
}

}  // namespace

void gelu_forward(const detail::GeluJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { gelu_fwd<T>(j); });
}
void gelu_backward(const detail::GeluJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { gelu_bwd<T>(j); });
}

}  // namespace fp8kit::cpu
