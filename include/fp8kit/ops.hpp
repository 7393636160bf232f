// fp8kit/ops.hpp: the layer math of a transformer as tensor operations - the f32/bf16 matmul
// and Linear, LayerNorm, RMSNorm, GELU, causal self-attention (softmax included), softmax
// cross-entropy, embedding and the AdamW update - each a forward and a backward, in the style of
// llm.c - and the residual add. The layers of <fp8kit/nn.hpp> are written on these alone, so every
// backend that implements them runs every layer.
//
// Conventions. Shapes in the comments: N rows (the product of all dimensions but the last),
// C channels, B batch, T time, NH heads, V vocabulary. Outputs are tensors the caller allocated
// (contiguous, the stated shape and dtype), so layers reuse their buffers; inputs may be any
// layout (non-contiguous ones are copied first). A backward *overwrites* the gradient of its
// input (dinp) and *adds* into parameter gradients (dweight, dbias), as a parameter may be used
// more than once. Tensors are f32; every op also takes f64 throughout (the finite-difference
// checks of the backward passes). Invalid arguments throw fp8kit::Error naming the op, the
// argument, its value and what was expected.
//
// Numerics (docs/NUMERICS.md, "Layer ops"): reductions that set a row's statistics (LayerNorm /
// RMSNorm mean and variance, softmax max and sum) are summed in double; the matmul sums in its
// accumulator's precision in k order. Results never depend on the thread count.
#pragma once

#include <cstdint>

#include "fp8kit/tensor.hpp"

namespace fp8kit {

// ---- matmul and Linear ----

struct MatmulOptions {
    bool transpose_a = false;  // a is stored [K, M]
    bool transpose_b = false;  // b is stored [N, K] (a Linear weight)
    bool accumulate = false;   // out += product, instead of out = product
};

// out[M, N] (+)= op(a)[M, K] . op(b)[K, N], op(x) = x or x^T as the options say. a and b f32 or
// bf16 (each; bf16 widens exactly), out f32 - or all three f64. Products summed in out's
// precision, in k order. M, N or K may be 0 (out is then left / set to zero).
void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const MatmulOptions& opts = {});

// out[N, OC] = inp[N, IC] . weight[OC, IC]^T + bias[OC] (bias may be undefined).
// inp may have any rank ([..., IC]); out then has the same leading dimensions ([..., OC]).
void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias = {});
// dinp[N, IC] = dout[N, OC] . weight[OC, IC] (skipped when dinp is undefined);
// dweight[OC, IC] += dout^T . inp; dbias[OC] += sum over rows of dout (when dbias is defined).
void linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);
// dbias[OC] += sum over rows of dout[N, OC] (rows added in order): a bias's gradient alone.
void bias_backward(const Tensor& dbias, const Tensor& dout);

// ---- normalization ----

// LayerNorm over the last dimension (torch.nn.LayerNorm): out[N, C] = (inp - mean) * rstd *
// weight[C] + bias[C], rstd = 1 / sqrt(var + eps), var the biased variance. mean, rstd [N] are
// written for the backward.
void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// dinp[N, C] = d/dinp; dweight[C], dbias[C] +=.
void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd);

// RMSNorm (torch.nn.RMSNorm): out[N, C] = inp * rstd * weight[C], rstd = 1 / sqrt(mean(inp^2) +
// eps); rstd [N] is written for the backward.
void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                     double eps = 1e-5);
// dinp[N, C] = d/dinp; dweight[C] +=.
void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);

// ---- GELU, tanh form (GPT-2; torch gelu(approximate="tanh")), elementwise ----

// out = 0.5 inp (1 + tanh(sqrt(2/pi) (inp + 0.044715 inp^3))); out and inp the same shape.
void gelu_forward(const Tensor& out, const Tensor& inp);
// dinp = gelu'(inp) * dout
void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout);

// ---- residual add, elementwise ----

// out = inp + residual, the residual broadcast over inp's leading dimensions: its shape is inp's,
// or inp's last dimensions (a position embedding [T, C] added to each sequence of [B, T, C]). out
// has inp's shape and may be inp itself (in place). One addition per element, rounded once, so
// every backend gives the same bits. Its backward is the identity for inp, and for a broadcast
// residual a sum over the leading rows (bias_backward on the [rows, numel(residual)] view).
void residual_forward(const Tensor& out, const Tensor& inp, const Tensor& residual);

// ---- causal multi-head self-attention (the core between the qkv and output projections) ----

// qkv[B, T, 3C] (q, k, v, each [B, T, NH, C/NH]) -> out[B, T, C]: per head, softmax over
// t2 <= t1 of q[t1] . k[t2] / sqrt(C/NH), times v. att[B, NH, T, T] receives the softmax
// probabilities (zero above the diagonal) for the backward. C must be a multiple of heads.
void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int64_t heads);
// dqkv[B, T, 3C] = d/dqkv (overwritten).
void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t heads);

// ---- attention of a few new positions over a key/value cache (a decode step) ----

// out[B, S, Hq, D]: for query head h and row s, the softmax over the attended keys j of
// scale * q[b, h, s] . k[b, h / G, j], times v[b, h / G, j], G = Hq / Hkv (grouped-query attention:
// G query heads read one key/value head, which is read once for all of them). q [B, Hq, S, D]; k, v
// [B, Hkv, L, D]; all bf16, f16 or f32, one dtype; mask undefined (every key attended) or bool
// [B or 1, S, L] (true: attended). A row with no attended key is 0, as torch's
// scaled_dot_product_attention gives it. What transformers asks of an attention function at a
// decode step with a KV cache (fp8kit.torch's "fp8kit" attention): the output in the layout its
// o_proj reads. Scores, softmax and sums in float32 (ref: float64), out rounded once; D <= 512.
void attention_decode(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      double scale);

// ---- softmax cross-entropy (torch.nn.functional.cross_entropy, per row) ----

// probs[N, V] = softmax(logits[N, V]); losses[N] = -log softmax(logits)[n, targets[n]], from the
// logits (not the rounded probability). targets: N i32 values in [0, V).
void crossentropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits, const Tensor& targets);
// dlogits[N, V] = (probs - onehot(targets)) * dloss: the gradient of dloss * (sum of losses).
void crossentropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets, float dloss);

// ---- embedding ----

// out[N, C] = table[ids[n], :]; ids [...] i32 in [0, V), out [..., C].
void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table);
// dtable[V, C] += dout rows scattered to their ids (repeated ids add up, in row order).
void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids);

// ---- AdamW (torch.optim.AdamW, decoupled weight decay) ----

struct AdamWUpdate {
    float lr = 1e-3f;
    float beta1 = 0.9f, beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;
    int64_t step = 1;  // 1 for the first update: the bias corrections use beta^step
};

// One update of param (in place) from grad, with the moments m, v (in place; zeros before the
// first step), all the same shape:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr wd p;
//   p -= lr (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWUpdate& u);

}  // namespace fp8kit
