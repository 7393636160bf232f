// src/nn/attention.cpp: the CausalSelfAttention module - qkv Linear, the causal attention core
// (the public ops attention_forward / attention_backward, <fp8kit/ops.hpp>), proj Linear.
// Checked against PyTorch by tests/nn/test_torch_gpt.cpp; the core by tests/ops/test_attention.cpp.
#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {

namespace {
constexpr size_t qkv_index = 0, proj_index = 1;
}

CausalSelfAttention::CausalSelfAttention(int64_t c, int64_t heads) : c_(c), heads_(heads) {
    if (heads < 1 || c % heads != 0)
        throw Error("fp8kit::nn::CausalSelfAttention: width " + std::to_string(c) + " is not a multiple of heads " +
                    std::to_string(heads));
    add_child("qkv", std::make_shared<Linear>(c, 3 * c));
    add_child("proj", std::make_shared<Linear>(c, c));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
    if (x.dim() != 3 || x.size(2) != c_)
        throw Error("fp8kit::nn::CausalSelfAttention::forward: x is " + to_string(x.shape()) + ", expected [B, T, " +
                    std::to_string(c_) + "]");
    const int64_t b = x.size(0), t = x.size(1);
    qkv_ = child<Linear>(qkv_index).forward(x).contiguous();  // [B, T, 3C]
    att_ = Tensor::empty({b, heads_, t, t}, DType::f32, x.device());
    Tensor y = Tensor::empty({b, t, c_}, DType::f32, x.device());
    attention_forward(y, att_, qkv_, heads_);
    return child<Linear>(proj_index).forward(y);
}

Tensor CausalSelfAttention::backward(const Tensor& dy) {
    if (!qkv_.defined()) throw Error("fp8kit::nn::CausalSelfAttention::backward: no forward to go back through");
    const Tensor dyc = child<Linear>(proj_index).backward(dy).contiguous();  // [B, T, C]
    Tensor dqkv = Tensor::empty(qkv_.shape(), DType::f32, qkv_.device());
    attention_backward(dqkv, dyc, qkv_, att_, heads_);
    qkv_ = att_ = Tensor();
    return child<Linear>(qkv_index).backward(dqkv);
}

size_t CausalSelfAttention::saved_bytes() const { return qkv_.defined() ? qkv_.nbytes() + att_.nbytes() : 0; }

}  // namespace fp8kit::nn
