// src/nn/embedding.cpp: the Embedding module on the public ops embedding_forward /
// embedding_backward (<fp8kit/ops.hpp>: a row gather and a scatter-add). Checked against PyTorch
// by tests/nn/test_torch_gpt.cpp; the ops by tests/ops/test_embedding.cpp.
#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {

Embedding::Embedding(int64_t num, int64_t dim) : dim_(dim) {
    if (num < 1 || dim < 1) throw Error("fp8kit::nn::Embedding: sizes must be >= 1");
    weight_ = add_parameter("weight", {num, dim});
}

Tensor Embedding::forward(const Tensor& ids) {
    if (ids.dtype() != DType::i32) throw Error("fp8kit::nn::Embedding::forward: ids must be i32, got " + std::string(to_string(ids.dtype())));
    Shape s = ids.shape();
    s.push_back(dim_);
    Tensor y = Tensor::empty(s, DType::f32, weight_->value.defined() ? weight_->value.device() : ids.device());
    embedding_forward(y, ids, weight_->compute_value());  // checks every id
    ids_ = ids.contiguous();
    return y;
}

void Embedding::backward(const Tensor& dy) {
    if (!ids_.defined() || dy.numel() != ids_.numel() * dim_ || !weight_->grad.defined())
        throw Error("fp8kit::nn::Embedding::backward: dy " + to_string(dy.shape()) + " does not match the forward ids (or the weight is stored in FP8)");
    Shape s = ids_.shape();
    s.push_back(dim_);
    embedding_backward(weight_->grad, dy.contiguous().reshape(s), ids_);
    ids_ = Tensor();
}

}  // namespace fp8kit::nn
