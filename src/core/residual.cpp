// src/core/residual.cpp: the public residual add - argument checks (the residual's shape is inp's
// or its trailing dimensions) and the hand-off to the backend (src/ref/residual.cpp,
// src/cpu/residual.cpp, src/cuda/residual.cu). Checked by tests/ops/test_residual.cpp.
#include <algorithm>

#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

void residual_forward(const Tensor& out, const Tensor& inp, const Tensor& residual) {
    const char* op = "residual_forward";
    const DType dt = detail::float_dtype(op, "inp", inp);
    const Shape& s = inp.shape();
    const bool trailing = residual.defined() && residual.dim() <= inp.dim() &&
                          std::equal(residual.shape().begin(), residual.shape().end(), s.end() - residual.dim());
    if (!trailing) {
        throw Error("fp8kit::residual_forward: residual is " + detail::describe(residual) + ", expected inp's shape " +
                    to_string(s) + " or its last dimensions");
    }
    const Tensor x = inp.contiguous();
    const Tensor r = detail::input(op, "residual", residual, dt, residual.shape());
    detail::output(op, "out", out, dt, s);
    const detail::Dispatch d = detail::dispatch(op, {{"out", &out}, {"inp", &inp}, {"residual", &residual}});
    d.ops.residual_forward({dt, x.numel(), r.numel(), x.const_raw_data(), r.const_raw_data(), out.raw_data(), d.ctx});
}

}  // namespace fp8kit
