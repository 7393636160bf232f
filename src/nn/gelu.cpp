// src/nn/gelu.cpp: GELU, tanh form (GPT-2; torch.nn.functional.gelu(approximate="tanh")):
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), its derivative, and the GELU module.
// Checked against central finite differences in float64 and PyTorch (tests/nn/).
#include <cmath>
#include <numbers>

#include "fp8kit/nn.hpp"
#include "nn/ops.hpp"

namespace fp8kit::nn {
namespace ops {

template <class T>
void gelu_forward(T* out, const T* inp, int64_t n) {
    const T s = T(std::sqrt(2.0 / std::numbers::pi));
#pragma omp parallel for schedule(static) if (n > parallel_min_work)
    for (int64_t i = 0; i < n; ++i) {
        const T x = inp[i];
        out[i] = T(0.5) * x * (T(1) + std::tanh(s * (x + T(0.044715) * x * x * x)));
    }
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
    const T s = T(std::sqrt(2.0 / std::numbers::pi));
#pragma omp parallel for schedule(static) if (n > parallel_min_work)
    for (int64_t i = 0; i < n; ++i) {
        const T x = inp[i];
        const T th = std::tanh(s * (x + T(0.044715) * x * x * x));
        const T sech2 = T(1) - th * th;
        dinp[i] = (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * s * (T(1) + T(3 * 0.044715) * x * x)) * dout[i];
    }
}

template void gelu_forward(float*, const float*, int64_t);
template void gelu_forward(double*, const double*, int64_t);
template void gelu_backward(float*, const float*, const float*, int64_t);
template void gelu_backward(double*, const double*, const double*, int64_t);

}  // namespace ops

Tensor GELU::forward(const Tensor& x) {
    if (x.dtype() != DType::f32) throw Error("fp8kit::nn::GELU::forward: x must be f32, got " + std::string(to_string(x.dtype())));
    x_ = x.contiguous();
    Tensor y = Tensor::empty(x_.shape(), DType::f32);
    ops::gelu_forward(y.data<float>(), x_.data<float>(), x_.numel());
    return y;
}

Tensor GELU::backward(const Tensor& dy) {
    if (!x_.defined() || dy.shape() != x_.shape())
        throw Error("fp8kit::nn::GELU::backward: dy " + to_string(dy.shape()) + " does not match the forward input");
    const Tensor g = dy.contiguous();
    Tensor dx = Tensor::empty(x_.shape(), DType::f32);
    ops::gelu_backward(dx.data<float>(), x_.data<float>(), g.data<float>(), x_.numel());
    x_ = Tensor();
    return dx;
}

}  // namespace fp8kit::nn
