// src/core/matmul.cpp: the public f32/bf16 matmul and the Linear forward/backward built on it -
// argument checks and the hand-off to the backend (src/ref/matmul.cpp, src/cpu/matmul.cpp,
// src/cuda/matmul.cu).
// Checked by tests/ops/test_matmul.cpp (backends against ref, errors) and tests/ops/test_backward.cpp.
#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

namespace {

using detail::describe;

// A matmul operand: 2-d, f32 or bf16 (f64 when the op is f64), contiguous (copied if not).
Tensor operand(const char* op, const char* arg, const Tensor& t, DType dtype) {
    const bool ok = t.defined() && t.dim() == 2 &&
                    (dtype == DType::f64 ? t.dtype() == DType::f64 : t.dtype() == DType::f32 || t.dtype() == DType::bf16);
    if (!ok) {
        throw Error(std::string("fp8kit::") + op + ": " + arg + " is " + describe(t) + ", expected a 2-d " +
                    (dtype == DType::f64 ? "f64" : "f32 or bf16") + " tensor");
    }
    return t.contiguous();
}

detail::MatmulJob matmul_job(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, const MatmulOptions& o,
                             const Tensor& bias, const Tensor& keep_a, const Tensor& keep_b) {
    const DType dt = detail::float_dtype(op, "out", out);
    const int64_t m = o.transpose_a ? a.size(1) : a.size(0), k = o.transpose_a ? a.size(0) : a.size(1);
    const int64_t kb = o.transpose_b ? b.size(1) : b.size(0), n = o.transpose_b ? b.size(0) : b.size(1);
    if (kb != k) {
        throw Error(std::string("fp8kit::") + op + ": a " + to_string(a.shape()) + (o.transpose_a ? " (transposed)" : "") +
                    " and b " + to_string(b.shape()) + (o.transpose_b ? " (transposed)" : "") + " do not agree on K");
    }
    detail::output(op, "out", out, dt, {m, n});
    if (bias.defined()) detail::expect_tensor(op, "bias", bias, dt, {n});
    return {dt, m, n, k, keep_a.const_raw_data(), a.dtype(), o.transpose_a, keep_b.const_raw_data(), b.dtype(), o.transpose_b,
            o.accumulate, nullptr, out.raw_data()};
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const MatmulOptions& opts) {
    const DType dt = detail::float_dtype("matmul", "out", out);
    const Tensor ac = operand("matmul", "a", a, dt), bc = operand("matmul", "b", b, dt);
    const detail::Dispatch d = detail::dispatch("matmul", {{"out", &out}, {"a", &a}, {"b", &b}});
    detail::MatmulJob job = matmul_job("matmul", out, a, b, opts, Tensor(), ac, bc);
    job.ctx = d.ctx;
    d.ops.matmul(job);
}

void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
    const DType dt = detail::float_dtype("linear_forward", "inp", inp);
    const Tensor w = operand("linear_forward", "weight", weight, dt);
    if (inp.dim() < 1 || inp.size(-1) != w.size(1)) {
        throw Error("fp8kit::linear_forward: inp is " + describe(inp) + ", expected [..., " + std::to_string(w.size(1)) + "]");
    }
    const Tensor x = inp.contiguous().reshape({-1, w.size(1)});
    detail::output("linear_forward", "out", out, dt, detail::with_last(inp.shape(), w.size(0)));
    const Tensor b = bias.defined() ? detail::input("linear_forward", "bias", bias, dt, {w.size(0)}) : Tensor();
    detail::MatmulJob job =
        matmul_job("linear_forward", out.reshape({-1, w.size(0)}), x, w, {.transpose_b = true}, b, x, w);
    job.bias = b.defined() ? b.const_raw_data() : nullptr;
    const detail::Dispatch d =
        detail::dispatch("linear_forward", {{"out", &out}, {"inp", &inp}, {"weight", &weight}, {"bias", &bias}});
    job.ctx = d.ctx;
    d.ops.matmul(job);
}

void linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight) {
    const char* op = "linear_backward";
    const DType dt = detail::float_dtype(op, "dweight", dweight);
    const Tensor w = operand(op, "weight", weight, dt);
    const int64_t oc = w.size(0), ic = w.size(1);
    detail::output(op, "dweight", dweight, dt, {oc, ic});
    if (inp.dim() < 1 || inp.size(-1) != ic) {
        throw Error("fp8kit::linear_backward: inp is " + describe(inp) + ", expected [..., " + std::to_string(ic) + "]");
    }
    const Tensor x = operand(op, "inp", inp.contiguous().reshape({-1, ic}), dt);
    const int64_t rows = x.size(0);
    if (dout.dim() < 1 || dout.size(-1) != oc || dout.numel() != rows * oc) {
        throw Error("fp8kit::linear_backward: dout is " + describe(dout) + ", expected " + std::to_string(rows) +
                    " rows of " + std::to_string(oc));
    }
    const Tensor g = operand(op, "dout", dout.contiguous().reshape({rows, oc}), dt);
    if (dinp.defined()) detail::output(op, "dinp", dinp, dt, inp.shape());
    if (dbias.defined()) {
        detail::output(op, "dbias", dbias, dt, {oc});
        if (g.dtype() != dt) throw Error("fp8kit::linear_backward: dout is " + describe(dout) + ", expected " +
                                         std::string(to_string(dt)) + " with a bias");
    }
    const detail::Dispatch d = detail::dispatch(
        op, {{"dinp", &dinp}, {"dweight", &dweight}, {"dbias", &dbias}, {"dout", &dout}, {"inp", &inp}, {"weight", &weight}});
    // dinp[N, IC] = dout[N, OC] . weight[OC, IC]
    if (dinp.defined()) {
        detail::MatmulJob job = matmul_job(op, dinp.reshape({rows, ic}), g, w, {}, Tensor(), g, w);
        job.ctx = d.ctx;
        d.ops.matmul(job);
    }
    // dweight[OC, IC] += dout^T[OC, N] . inp[N, IC]
    detail::MatmulJob job = matmul_job(op, dweight, g, x, {.transpose_a = true, .accumulate = true}, Tensor(), g, x);
    job.ctx = d.ctx;
    d.ops.matmul(job);
    if (dbias.defined()) d.ops.bias_grad({dt, rows, oc, g.const_raw_data(), dbias.raw_data(), d.ctx});
}

void bias_backward(const Tensor& dbias, const Tensor& dout) {
    const DType dt = detail::float_dtype("bias_backward", "dbias", dbias);
    if (dbias.dim() != 1 || dout.dim() < 1 || dout.size(-1) != dbias.size(0)) {
        throw Error("fp8kit::bias_backward: dbias is " + describe(dbias) + " and dout " + describe(dout) +
                    ", expected dbias [OC] and dout [..., OC]");
    }
    detail::output("bias_backward", "dbias", dbias, dt, dbias.shape());
    const Tensor g = detail::input("bias_backward", "dout", dout, dt, dout.shape());
    const detail::Dispatch d = detail::dispatch("bias_backward", {{"dbias", &dbias}, {"dout", &dout}});
    d.ops.bias_grad({dt, detail::leading_rows(g), dbias.size(0), g.const_raw_data(), dbias.raw_data(), d.ctx});
}

}  // namespace fp8kit
