// src/nn/adamw.cpp: AdamW with decoupled weight decay, the update of torch.optim.AdamW:
//   p -= lr wd p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// on the float32 parameters (the master weights, whatever precision the GEMMs use). Weight decay
// only on matrices (rank >= 2), as GPT-2 / nanoGPT. Checked by the training tests (tests/nn/).
#include <cmath>

#include "fp8kit/nn.hpp"
#include "nn/ops.hpp"

namespace fp8kit::nn {

AdamW::AdamW(std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> params, AdamWOptions opts)
    : params_(std::move(params)), opts_(opts) {
    if (!(opts.lr >= 0) || !(opts.beta1 >= 0 && opts.beta1 < 1) || !(opts.beta2 >= 0 && opts.beta2 < 1) || !(opts.eps > 0) ||
        !(opts.weight_decay >= 0))
        throw Error("fp8kit::nn::AdamW: options out of range (lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0)");
    for (const auto& [name, p] : params_) {
        if (!p->value.defined() || !p->grad.defined())
            throw Error("fp8kit::nn::AdamW: parameter '" + name + "' is stored in FP8 and cannot be trained");
        m_.emplace_back(size_t(p->value.numel()), 0.0f);
        v_.emplace_back(size_t(p->value.numel()), 0.0f);
    }
}

void AdamW::step(float lr) {
    ++t_;
    const float c1 = 1.0f - std::pow(opts_.beta1, float(t_)), c2 = 1.0f - std::pow(opts_.beta2, float(t_));
    for (size_t i = 0; i < params_.size(); ++i) {
        Parameter& p = *params_[i].second;
        float* w = p.value.data<float>();
        const float* g = p.grad.data<float>();
        float* m = m_[i].data();
        float* v = v_[i].data();
        const float wd = p.value.dim() >= 2 ? opts_.weight_decay : 0.0f;
        const int64_t n = p.value.numel();
#pragma omp parallel for schedule(static) if (n > ops::parallel_min_work)
        for (int64_t j = 0; j < n; ++j) {
            m[j] = opts_.beta1 * m[j] + (1.0f - opts_.beta1) * g[j];
            v[j] = opts_.beta2 * v[j] + (1.0f - opts_.beta2) * g[j] * g[j];
            w[j] -= lr * wd * w[j];
            w[j] -= lr * (m[j] / c1) / (std::sqrt(v[j] / c2) + opts_.eps);
        }
    }
}

size_t AdamW::state_bytes() const {
    size_t s = 0;
    for (const auto& m : m_) s += 2 * m.size() * sizeof(float);
    return s;
}

}  // namespace fp8kit::nn
