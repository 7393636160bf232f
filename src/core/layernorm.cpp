// src/core/layernorm.cpp: the public LayerNorm and RMSNorm forward/backward - argument checks and
// the hand-off to the backend (src/ref/layernorm.cpp, src/cpu/layernorm.cpp).
// Checked by tests/ops/test_layernorm.cpp and tests/ops/test_backward.cpp.
#include <cmath>

#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

namespace {

// x [..., C] as (rows, C); C from the weight.
struct Rows {
    DType dtype;
    int64_t rows, c;
};

Rows rows_of(const char* op, const Tensor& inp, const Tensor& weight) {
    const DType dt = detail::float_dtype(op, "inp", inp);
    if (inp.dim() < 1) throw Error(std::string("fp8kit::") + op + ": inp is a scalar, expected [..., C]");
    const int64_t c = inp.size(-1);
    detail::expect_tensor(op, "weight", weight, dt, {c});
    return {dt, detail::leading_rows(inp), c};
}

void check_eps(const char* op, double eps) {
    if (!(eps >= 0.0) || std::isinf(eps)) {
        throw Error(std::string("fp8kit::") + op + ": eps is " + std::to_string(eps) + ", expected a finite value >= 0");
    }
}

}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, double eps) {
    const char* op = "layernorm_forward";
    const auto [dt, rows, c] = rows_of(op, inp, weight);
    check_eps(op, eps);
    const Tensor x = inp.contiguous(), w = weight.contiguous();
    const Tensor b = detail::input(op, "bias", bias, dt, {c});
    detail::output(op, "out", out, dt, inp.shape());
    detail::output(op, "mean", mean, dt, {rows});
    detail::output(op, "rstd", rstd, dt, {rows});
    const detail::Dispatch d = detail::dispatch(op, {{"out", &out}, {"mean", &mean}, {"rstd", &rstd}, {"inp", &inp}, {"weight", &weight}, {"bias", &bias}});
    d.ops.layernorm_forward(
        {dt, rows, c, eps, x.const_raw_data(), w.const_raw_data(), b.const_raw_data(), out.raw_data(), mean.raw_data(), rstd.raw_data(), d.ctx});
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
    const char* op = "layernorm_backward";
    const auto [dt, rows, c] = rows_of(op, inp, weight);
    const Tensor x = inp.contiguous(), w = weight.contiguous();
    const Tensor g = detail::input(op, "dout", dout, dt, inp.shape());
    const Tensor mu = detail::input(op, "mean", mean, dt, {rows}), rs = detail::input(op, "rstd", rstd, dt, {rows});
    detail::output(op, "dinp", dinp, dt, inp.shape());
    detail::output(op, "dweight", dweight, dt, {c});
    detail::output(op, "dbias", dbias, dt, {c});
    const detail::Dispatch d = detail::dispatch(op, {{"dinp", &dinp}, {"dweight", &dweight}, {"dbias", &dbias}, {"dout", &dout}, {"inp", &inp}, {"weight", &weight}, {"mean", &mean}, {"rstd", &rstd}});
    d.ops.layernorm_backward({dt, rows, c, g.const_raw_data(), x.const_raw_data(), w.const_raw_data(), mu.const_raw_data(),
                                            rs.const_raw_data(), dinp.raw_data(), dweight.raw_data(), dbias.raw_data(), d.ctx});
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight, double eps) {
    const char* op = "rmsnorm_forward";
    const auto [dt, rows, c] = rows_of(op, inp, weight);
    check_eps(op, eps);
    const Tensor x = inp.contiguous(), w = weight.contiguous();
    detail::output(op, "out", out, dt, inp.shape());
    detail::output(op, "rstd", rstd, dt, {rows});
    const detail::Dispatch d = detail::dispatch(op, {{"out", &out}, {"rstd", &rstd}, {"inp", &inp}, {"weight", &weight}});
    d.ops.rmsnorm_forward(
        {dt, rows, c, eps, x.const_raw_data(), w.const_raw_data(), nullptr, out.raw_data(), nullptr, rstd.raw_data(), d.ctx});
}

void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd) {
    const char* op = "rmsnorm_backward";
    const auto [dt, rows, c] = rows_of(op, inp, weight);
    const Tensor x = inp.contiguous(), w = weight.contiguous();
    const Tensor g = detail::input(op, "dout", dout, dt, inp.shape());
    const Tensor rs = detail::input(op, "rstd", rstd, dt, {rows});
    detail::output(op, "dinp", dinp, dt, inp.shape());
    detail::output(op, "dweight", dweight, dt, {c});
    const detail::Dispatch d = detail::dispatch(op, {{"dinp", &dinp}, {"dweight", &dweight}, {"dout", &dout}, {"inp", &inp}, {"weight", &weight}, {"rstd", &rstd}});
    d.ops.rmsnorm_backward({dt, rows, c, g.const_raw_data(), x.const_raw_data(), w.const_raw_data(), nullptr, rs.const_raw_data(),
                                          dinp.raw_data(), dweight.raw_data(), nullptr, d.ctx});
}

}  // namespace fp8kit
