// src/nn/adamw.cpp: AdamW with decoupled weight decay, the update of torch.optim.AdamW:
//   p -= lr wd p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// on the float32 parameters (the master weights, whatever precision the GEMMs use). Weight decay
// only on matrices (rank >= 2), as GPT-2 / nanoGPT. The update is the public op adamw_update
// (<fp8kit/ops.hpp>, checked by tests/ops/test_adamw.cpp); the optimizer by the training tests (tests/nn/).
#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {

AdamW::AdamW(std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> params, AdamWOptions opts)
    : params_(std::move(params)), opts_(opts) {
    if (!(opts.lr >= 0) || !(opts.beta1 >= 0 && opts.beta1 < 1) || !(opts.beta2 >= 0 && opts.beta2 < 1) || !(opts.eps > 0) ||
        !(opts.weight_decay >= 0))
        throw Error("fp8kit::nn::AdamW: options out of range (lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0)");
    for (const auto& [name, p] : params_) {
        if (!p->value.defined() || !p->grad.defined())
            throw Error("fp8kit::nn::AdamW: parameter " + quote_printable(name) + " is stored in FP8 and cannot be trained");
        m_.push_back(Tensor::zeros(p->value.shape(), DType::f32, p->value.device()));
        v_.push_back(Tensor::zeros(p->value.shape(), DType::f32, p->value.device()));
    }
}

void AdamW::step(float lr) {
    ++t_;
    for (size_t i = 0; i < params_.size(); ++i) {
        Parameter& p = *params_[i].second;
        const float wd = p.value.dim() >= 2 ? opts_.weight_decay : 0.0f;
        adamw_update(p.value, p.grad, m_[i], v_[i], {lr, opts_.beta1, opts_.beta2, opts_.eps, wd, t_});
    }
}

size_t AdamW::state_bytes() const {
    size_t s = 0;
    for (const auto& m : m_) s += 2 * m.nbytes();
    return s;
}

}  // namespace fp8kit::nn
