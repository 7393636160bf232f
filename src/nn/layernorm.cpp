// src/nn/layernorm.cpp: the LayerNorm and RMSNorm modules (torch.nn.LayerNorm / torch.nn.RMSNorm,
// eps 1e-5) on the public ops layernorm_* / rmsnorm_* (<fp8kit/ops.hpp>). Checked against PyTorch
// by tests/nn/test_torch_gpt.cpp; the ops themselves by tests/ops/test_layernorm.cpp.
#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {

namespace {
Tensor check_rows(const Tensor& x, int64_t c, const char* who) {
    if (x.dtype() != DType::f32 || x.dim() < 1 || x.size(-1) != c)
        throw Error(std::string(who) + ": x is " + std::string(to_string(x.dtype())) + " " + to_string(x.shape()) +
                    ", expected f32 [..., " + std::to_string(c) + "]");
    return x.contiguous();
}
}  // namespace

LayerNorm::LayerNorm(int64_t c) : c_(c) {
    weight_ = add_parameter("weight", {c});
    bias_ = add_parameter("bias", {c});
    float* w = weight_->value.data<float>();
    for (int64_t i = 0; i < c; ++i) w[i] = 1.0f;
}

Tensor LayerNorm::forward(const Tensor& x) {
    x_ = check_rows(x, c_, "fp8kit::nn::LayerNorm::forward");
    const int64_t rows = x_.numel() / c_;
    Tensor y = Tensor::empty(x_.shape(), DType::f32, x_.device());
    mean_ = Tensor::empty({rows}, DType::f32, x_.device());
    rstd_ = Tensor::empty({rows}, DType::f32, x_.device());
    layernorm_forward(y, mean_, rstd_, x_, weight_->compute_value(), bias_->compute_value());
    return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
    if (!x_.defined() || dy.shape() != x_.shape())
        throw Error("fp8kit::nn::LayerNorm::backward: dy " + to_string(dy.shape()) + " does not match the forward input");
    Tensor dx = Tensor::empty(x_.shape(), DType::f32, x_.device());
    layernorm_backward(dx, weight_->grad, bias_->grad, dy, x_, weight_->value, mean_, rstd_);
    x_ = mean_ = rstd_ = Tensor();
    return dx;
}

size_t LayerNorm::saved_bytes() const { return x_.defined() ? x_.nbytes() + mean_.nbytes() + rstd_.nbytes() : 0; }

RMSNorm::RMSNorm(int64_t c) : c_(c) {
    weight_ = add_parameter("weight", {c});
    float* w = weight_->value.data<float>();
    for (int64_t i = 0; i < c; ++i) w[i] = 1.0f;
}

Tensor RMSNorm::forward(const Tensor& x) {
    x_ = check_rows(x, c_, "fp8kit::nn::RMSNorm::forward");
    const int64_t rows = x_.numel() / c_;
    Tensor y = Tensor::empty(x_.shape(), DType::f32, x_.device());
    rstd_ = Tensor::empty({rows}, DType::f32, x_.device());
    rmsnorm_forward(y, rstd_, x_, weight_->compute_value());
    return y;
}

Tensor RMSNorm::backward(const Tensor& dy) {
    if (!x_.defined() || dy.shape() != x_.shape())
        throw Error("fp8kit::nn::RMSNorm::backward: dy " + to_string(dy.shape()) + " does not match the forward input");
    Tensor dx = Tensor::empty(x_.shape(), DType::f32, x_.device());
    rmsnorm_backward(dx, weight_->grad, dy, x_, weight_->value, rstd_);
    x_ = rstd_ = Tensor();
    return dx;
}

size_t RMSNorm::saved_bytes() const { return x_.defined() ? x_.nbytes() + rstd_.nbytes() : 0; }

}  // namespace fp8kit::nn
