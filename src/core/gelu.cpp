// src/core/gelu.cpp: the public GELU forward/backward - argument checks and the hand-off to the
// backend (src/ref/gelu.cpp, src/cpu/gelu.cpp, src/cuda/gelu.cu). Checked by tests/ops/test_gelu.cpp
// and tests/ops/test_backward.cpp.
#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

void gelu_forward(const Tensor& out, const Tensor& inp) {
    const DType dt = detail::float_dtype("gelu_forward", "inp", inp);
    const Tensor x = inp.contiguous();
    detail::output("gelu_forward", "out", out, dt, inp.shape());
    const detail::Dispatch d = detail::dispatch("gelu_forward", {{"out", &out}, {"inp", &inp}});
    d.ops.gelu_forward({dt, x.numel(), x.const_raw_data(), nullptr, out.raw_data(), d.ctx});
}

void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
    const DType dt = detail::float_dtype("gelu_backward", "inp", inp);
    const Tensor x = inp.contiguous();
    const Tensor g = detail::input("gelu_backward", "dout", dout, dt, inp.shape());
    detail::output("gelu_backward", "dinp", dinp, dt, inp.shape());
    const detail::Dispatch d = detail::dispatch("gelu_backward", {{"dinp", &dinp}, {"inp", &inp}, {"dout", &dout}});
    d.ops.gelu_backward({dt, x.numel(), x.const_raw_data(), g.const_raw_data(), dinp.raw_data(), d.ctx});
}

}  // namespace fp8kit
