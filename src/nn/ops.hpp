// src/nn/ops.hpp: the forward and backward passes of every layer of src/nn, as plain loops over
// row-major arrays (in the style of llm.c), templated on the float type: float for training,
// double for the finite-difference checks of tests/nn/test_ops.cpp. Instantiated for float and
// double in the .cpp of each op family (matmul, linear, layernorm, gelu, attention, embedding,
// crossentropy).
//
// Conventions: shapes in the comments; B batch, T time, C channels, NH heads, V vocabulary,
// N rows (= B * T). A backward *overwrites* the gradient of its input (dinp) and *accumulates*
// into parameter gradients (dweight, dbias), as parameters may be used more than once. Every
// output element is computed by one thread in a fixed order, so results do not depend on the
// thread count (the e2e test checks that two runs agree bit for bit).
#pragma once

#include <cstdint>

namespace fp8kit::nn::ops {

// Loops with less work than this (elements; GEMMs: 32x this many multiply-adds) run on one
// thread: on a busy 2-core machine a parallel region's barrier costs more than it saves below
// it (measured: a 512x192x64 GEMM ran at 1.6 GFLOP/s on two contended threads, 26 on one).
inline constexpr int64_t parallel_min_work = int64_t(1) << 18;

enum class Trans : uint8_t { no, yes };

// C[m, n] (+)= op(A)[m, k] . op(B)[k, n]. op(A) = A stored [m, k] (no) or A^T with A stored
// [k, m] (yes); op(B) = B stored [k, n] (no) or B^T with B stored [n, k] (yes). Products summed in
// T. Any shape (m, n or k may be 0: C is then left / set to zero).
template <class T>
void matmul(T* c, const T* a, Trans ta, const T* b, Trans tb, int64_t m, int64_t n, int64_t k, bool accumulate);

// out[N, OC] = inp[N, IC] . weight[OC, IC]^T + bias[OC] (bias may be null)
template <class T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t rows, int64_t in, int64_t out_features);
// dinp[N, IC] = dout . weight (dinp may be null); dweight[OC, IC] += dout^T . inp;
// dbias[OC] += sum over rows of dout (may be null)
template <class T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t rows,
                     int64_t in, int64_t out_features);

// LayerNorm over the last dimension: out = (x - mean) * rstd * weight + bias, with
// rstd = 1 / sqrt(var + 1e-5) (biased variance, as torch.nn.LayerNorm). mean, rstd [N] are kept for backward.
template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t rows, int64_t c);
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int64_t rows, int64_t c);
// RMSNorm: out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + 1e-5); rstd [N] kept.
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t rows, int64_t c);
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t rows,
                      int64_t c);

// GELU, tanh form (GPT-2, torch gelu(approximate="tanh")), elementwise over n values.
template <class T>
void gelu_forward(T* out, const T* inp, int64_t n);
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

// Causal self-attention core. qkv [B, T, 3C] (q, k, v each [B, T, NH, C/NH]) -> out [B, T, C];
// att [B, NH, T, T] keeps the softmax probabilities (zero above the diagonal) for backward.
template <class T>
void attention_forward(T* out, T* att, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh);
// dqkv [B, T, 3C] overwritten.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t b, int64_t t, int64_t c, int64_t nh);

// out[N, C] = table[ids[n], :]; ids must be in [0, V) (checked by the caller).
template <class T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t rows, int64_t c);
// dtable[V, C] += scatter of dout rows
template <class T>
void embedding_backward(T* dtable, const T* dout, const int32_t* ids, int64_t rows, int64_t c);

// Softmax cross-entropy: probs[N, V] = softmax(logits), losses[N] = -log probs[n, target[n]].
template <class T>
void crossentropy_forward(T* losses, T* probs, const T* logits, const int32_t* targets, int64_t rows, int64_t v);
// dlogits[N, V] = (probs - onehot(target)) * dloss (the gradient of dloss * sum of losses)
template <class T>
void crossentropy_backward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int64_t rows, int64_t v);

}  // namespace fp8kit::nn::ops
