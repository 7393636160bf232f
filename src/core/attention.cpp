// src/core/attention.cpp: the public causal self-attention forward/backward (scores, causal
// softmax, weighted sum) and the attention of new positions over a key/value cache
// (attention_decode) - argument checks and the hand-off to the backend (src/ref/attention.cpp,
// src/cpu/attention.cpp, src/cuda/attention.cu). Checked by tests/ops/test_attention.cpp and
// tests/ops/test_backward.cpp.
#include <cmath>

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

void attention_decode(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      double scale) {
    const char* op = "attention_decode";
    const auto fail = [&](const std::string& what) { throw Error(std::string("fp8kit::") + op + ": " + what); };
    if (!q.defined() || q.dim() != 4 || (q.dtype() != DType::bf16 && q.dtype() != DType::f16 && q.dtype() != DType::f32)) {
        fail("q is " + detail::describe(q) + ", expected a bf16, f16 or f32 tensor [B, Hq, S, D]");
    }
    const DType dt = q.dtype();
    const int64_t b = q.size(0), hq = q.size(1), s = q.size(2), d = q.size(3);
    if (!k.defined() || k.dim() != 4 || k.size(0) != b || k.size(3) != d) {
        fail("k is " + detail::describe(k) + ", expected " + std::string(to_string(dt)) + " [" + std::to_string(b) +
             ", Hkv, L, " + std::to_string(d) + "] (q is " + detail::describe(q) + ")");
    }
    const int64_t hkv = k.size(1), l = k.size(2);
    if (hkv < 1 || hq % hkv != 0) {
        fail("k has " + std::to_string(hkv) + " heads, expected a divisor of q's " + std::to_string(hq));
    }
    if (d < 1 || d > 512) fail("the head size is " + std::to_string(d) + ", expected 1 to 512");
    if (!std::isfinite(scale)) fail("scale is " + std::to_string(scale) + ", expected a finite number");
    const Tensor kc = detail::input(op, "k", k, dt, k.shape());
    const Tensor vc = detail::input(op, "v", v, dt, k.shape());
    const Tensor qc = q.contiguous();
    Tensor mc;
    int64_t mask_b = 0;
    if (mask.defined()) {
        mask_b = mask.dim() == 3 ? mask.size(0) : 0;
        if (mask.dtype() != DType::boolean || (mask_b != 1 && mask_b != b)) {
            fail("mask is " + detail::describe(mask) + ", expected bool [" + std::to_string(b) + " or 1, " +
                 std::to_string(s) + ", " + std::to_string(l) + "]");
        }
        mc = detail::input(op, "mask", mask, DType::boolean, {mask_b, s, l});
    }
    detail::output(op, "out", out, dt, {b, s, hq, d});
    const detail::Dispatch disp = detail::dispatch(op, {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}, {"mask", &mask}});
    detail::AttentionDecodeJob j{dt, b, hq, hkv, s, l, d, mask_b, scale, qc.const_raw_data(), kc.const_raw_data(),
                                 vc.const_raw_data(), mc.defined() ? static_cast<const uint8_t*>(mc.const_raw_data()) : nullptr,
                                 out.raw_data()};
    j.ctx = disp.ctx;
    if (out.numel() == 0) return;
    disp.ops.attention_decode(j);
}

}  // namespace fp8kit
