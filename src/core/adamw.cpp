// src/core/adamw.cpp: the public AdamW update - argument checks, the bias corrections (computed
// once here, in float32, so every backend uses the same ones) and the hand-off to the backend
// (src/ref/adamw.cpp, src/cpu/adamw.cpp). Checked by tests/ops/test_adamw.cpp.
#include <cmath>

#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWUpdate& u) {
    const char* op = "adamw_update";
    const DType dt = detail::float_dtype(op, "param", param);
    if (!(u.lr >= 0) || !(u.beta1 >= 0 && u.beta1 < 1) || !(u.beta2 >= 0 && u.beta2 < 1) || !(u.eps > 0) ||
        !(u.weight_decay >= 0) || u.step < 1) {
        throw Error("fp8kit::adamw_update: lr " + std::to_string(u.lr) + ", betas " + std::to_string(u.beta1) + ", " +
                    std::to_string(u.beta2) + ", eps " + std::to_string(u.eps) + ", weight_decay " +
                    std::to_string(u.weight_decay) + ", step " + std::to_string(u.step) +
                    ": expected lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0, step >= 1");
    }
    detail::output(op, "param", param, dt, param.shape());
    const Tensor g = detail::input(op, "grad", grad, dt, param.shape());
    detail::output(op, "m", m, dt, param.shape());
    detail::output(op, "v", v, dt, param.shape());
    // float32 powers, as torch.optim.AdamW's float32 step count gives them.
    const float c1 = 1.0f - std::pow(u.beta1, float(u.step)), c2 = 1.0f - std::pow(u.beta2, float(u.step));
    const detail::Dispatch d = detail::dispatch(op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}});
    d.ops.adamw_update({dt, param.numel(), param.raw_data(), m.raw_data(), v.raw_data(), g.const_raw_data(), u.lr,
                                      u.beta1, u.beta2, u.eps, u.weight_decay, c1, c2, d.ctx});
}

}  // namespace fp8kit
