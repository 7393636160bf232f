// src/nn/gelu.cpp: the GELU module (tanh form, GPT-2; torch gelu(approximate="tanh")) on the
// public ops gelu_forward / gelu_backward (<fp8kit/ops.hpp>). Checked against PyTorch by
// tests/nn/test_torch_gpt.cpp; the ops themselves by tests/ops/test_gelu.cpp.
#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {

Tensor GELU::forward(const Tensor& x) {
    if (x.dtype() != DType::f32) throw Error("fp8kit::nn::GELU::forward: x must be f32, got " + std::string(to_string(x.dtype())));
    x_ = x.contiguous();
    Tensor y = Tensor::empty(x_.shape(), DType::f32, x_.device());
    gelu_forward(y, x_);
    return y;
}

Tensor GELU::backward(const Tensor& dy) {
    if (!x_.defined() || dy.shape() != x_.shape())
        throw Error("fp8kit::nn::GELU::backward: dy " + to_string(dy.shape()) + " does not match the forward input");
    Tensor dx = Tensor::empty(x_.shape(), DType::f32, x_.device());
    gelu_backward(dx, x_, dy);
    x_ = Tensor();
    return dx;
}

}  // namespace fp8kit::nn
