// src/core/attention.cpp: the public causal self-attention forward/backward (scores, causal
// softmax, weighted sum) - argument checks and the hand-off to the backend (src/ref/attention.cpp,
// src/cpu/attention.cpp). Checked by tests/ops/test_attention.cpp and tests/ops/test_backward.cpp.
#include "core/layer_args.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit {

namespace {

// qkv [B, T, 3C] with C a multiple of heads: the job's sizes.
detail::AttentionJob attention_job(const char* op, const Tensor& qkv, int64_t heads) {
    const DType dt = detail::float_dtype(op, "qkv", qkv);
    if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) {
        throw Error(std::string("fp8kit::") + op + ": qkv is " + detail::describe(qkv) + ", expected [B, T, 3C]");
    }
    const int64_t c = qkv.size(2) / 3;
    if (heads < 1 || c % heads != 0) {
        throw Error(std::string("fp8kit::") + op + ": heads is " + std::to_string(heads) + ", expected a divisor of C = " +
                    std::to_string(c));
    }
    return {dt, qkv.size(0), qkv.size(1), c, heads, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int64_t heads) {
    detail::AttentionJob j = attention_job("attention_forward", qkv, heads);
    const Tensor q = qkv.contiguous();
    detail::output("attention_forward", "out", out, j.dtype, {j.b, j.t, j.c});
    detail::output("attention_forward", "att", att, j.dtype, {j.b, j.nh, j.t, j.t});
    j.qkv = q.const_raw_data();
    j.out = out.raw_data();
    j.att = att.raw_data();
    const detail::Dispatch d = detail::dispatch("attention_forward", {{"out", &out}, {"att", &att}, {"qkv", &qkv}});
    j.ctx = d.ctx;
    d.ops.attention_forward(j);
}

void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t heads) {
    detail::AttentionJob j = attention_job("attention_backward", qkv, heads);
    const Tensor q = qkv.contiguous();
    const Tensor g = detail::input("attention_backward", "dout", dout, j.dtype, {j.b, j.t, j.c});
    const Tensor a = detail::input("attention_backward", "att", att, j.dtype, {j.b, j.nh, j.t, j.t});
    detail::output("attention_backward", "dqkv", dqkv, j.dtype, qkv.shape());
    j.qkv = q.const_raw_data();
    j.saved_att = a.const_raw_data();
    j.dout = g.const_raw_data();
    j.dqkv = dqkv.raw_data();
    const detail::Dispatch d = detail::dispatch("attention_backward", {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"att", &att}});
    j.ctx = d.ctx;
    d.ops.attention_backward(j);
}

}  // namespace fp8kit
