// src/nn/crossentropy.cpp: the CrossEntropy loss (torch.nn.functional.cross_entropy, mean over
// rows) on the public ops crossentropy_forward / crossentropy_backward (<fp8kit/ops.hpp>).
// Checked against PyTorch by tests/nn/test_torch_gpt.cpp; the ops by tests/ops/test_crossentropy.cpp.
#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {

float CrossEntropy::forward(const Tensor& logits, const Tensor& targets) {
    if (logits.dtype() != DType::f32 || logits.dim() < 1 || targets.dtype() != DType::i32 ||
        targets.numel() * logits.size(-1) != logits.numel())
        throw Error("fp8kit::nn::CrossEntropy: logits " + to_string(logits.shape()) + " and targets " +
                    to_string(targets.shape()) + " (i32) do not match");
    const int64_t v = logits.size(-1), rows = targets.numel();
    targets_ = targets.contiguous().reshape({rows});
    probs_ = Tensor::empty({rows, v}, DType::f32, logits.device());
    Tensor losses = Tensor::empty({rows}, DType::f32, logits.device());
    crossentropy_forward(losses, probs_, logits, targets_);
    const Tensor host = losses.to(Device::cpu);
    double mean = 0.0;
    for (int64_t r = 0; r < rows; ++r) mean += double(host.data<float>()[r]);
    return float(mean / double(rows));
}

Tensor CrossEntropy::backward() const {
    if (!probs_.defined()) throw Error("fp8kit::nn::CrossEntropy::backward: no forward");
    Tensor d = Tensor::empty(probs_.shape(), DType::f32, probs_.device());
    crossentropy_backward(d, probs_, targets_, 1.0f / float(probs_.size(0)));
    return d;
}

}  // namespace fp8kit::nn
