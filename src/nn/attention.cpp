// src/nn/attention.cpp: causal multi-head self-attention - attention_forward/backward (the core:
// scores, causal softmax, weighted sum; as llm.c) and the CausalSelfAttention module (qkv Linear,
// core, proj Linear). Scores and softmax sums in double, so float32 stays within a few roundings
// of PyTorch's. Checked against central finite differences in float64 and PyTorch (tests/nn/).
#include <cmath>
#include <limits>
#include <vector>

#include "fp8kit/nn.hpp"
#include "nn/ops.hpp"

namespace fp8kit::nn {
namespace ops {

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int64_t b, int64_t t, int64_t c, int64_t nh) {
    const int64_t hs = c / nh;  // head size
    const double scale = 1.0 / std::sqrt(double(hs));
#pragma omp parallel for schedule(static) collapse(2) if (b * t * t * c > 16 * parallel_min_work)
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < nh; ++h)
            for (int64_t t1 = 0; t1 < t; ++t1) {
                const T* q = qkv + (bb * t + t1) * 3 * c + h * hs;  // [hs]
                T* a = att + ((bb * nh + h) * t + t1) * t;          // [T]
                double maxv = -std::numeric_limits<double>::infinity();
                std::vector<double> score(static_cast<size_t>(t1 + 1));
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const T* k = qkv + (bb * t + t2) * 3 * c + c + h * hs;
                    double s = 0.0;
                    for (int64_t i = 0; i < hs; ++i) s += double(q[i]) * double(k[i]);
                    score[size_t(t2)] = s * scale;
                    maxv = std::max(maxv, s * scale);
                }
                double sum = 0.0;
                for (int64_t t2 = 0; t2 <= t1; ++t2) sum += (score[size_t(t2)] = std::exp(score[size_t(t2)] - maxv));
                for (int64_t t2 = 0; t2 < t; ++t2) a[t2] = t2 <= t1 ? T(score[size_t(t2)] / sum) : T(0);
                T* o = out + (bb * t + t1) * c + h * hs;  // [hs]
                for (int64_t i = 0; i < hs; ++i) {
                    double acc = 0.0;
                    for (int64_t t2 = 0; t2 <= t1; ++t2) acc += double(a[t2]) * double(qkv[(bb * t + t2) * 3 * c + 2 * c + h * hs + i]);
                    o[i] = T(acc);
                }
            }
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t b, int64_t t, int64_t c, int64_t nh) {
    const int64_t hs = c / nh;
    const double scale = 1.0 / std::sqrt(double(hs));
    // Each (batch, head) writes only its own slices of dq, dk, dv: no two iterations share an output.
#pragma omp parallel for schedule(static) collapse(2) if (b * t * t * c > 16 * parallel_min_work)
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < nh; ++h) {
            for (int64_t t1 = 0; t1 < t; ++t1)
                for (int64_t j = 0; j < 3; ++j)
                    for (int64_t i = 0; i < hs; ++i) dqkv[(bb * t + t1) * 3 * c + j * c + h * hs + i] = T(0);
            std::vector<double> datt(static_cast<size_t>(t));
            for (int64_t t1 = 0; t1 < t; ++t1) {
                const T* a = att + ((bb * nh + h) * t + t1) * t;
                const T* g = dout + (bb * t + t1) * c + h * hs;  // [hs]
                // out = sum_t2 a[t2] v[t2]: datt[t2] = g . v[t2], dv[t2] += a[t2] g
                double dot_a = 0.0;
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const T* v = qkv + (bb * t + t2) * 3 * c + 2 * c + h * hs;
                    T* dv = dqkv + (bb * t + t2) * 3 * c + 2 * c + h * hs;
                    double s = 0.0;
                    for (int64_t i = 0; i < hs; ++i) {
                        s += double(g[i]) * double(v[i]);
                        dv[i] += a[t2] * g[i];
                    }
                    datt[size_t(t2)] = s;
                    dot_a += s * double(a[t2]);
                }
                // softmax: dscore[t2] = a[t2] (datt[t2] - sum a datt); score = scale q . k
                const T* q = qkv + (bb * t + t1) * 3 * c + h * hs;
                T* dq = dqkv + (bb * t + t1) * 3 * c + h * hs;
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const double ds = double(a[t2]) * (datt[size_t(t2)] - dot_a) * scale;
                    const T* k = qkv + (bb * t + t2) * 3 * c + c + h * hs;
                    T* dk = dqkv + (bb * t + t2) * 3 * c + c + h * hs;
                    for (int64_t i = 0; i < hs; ++i) {
                        dq[i] += T(ds * double(k[i]));
                        dk[i] += T(ds * double(q[i]));
                    }
                }
            }
        }
}

template void attention_forward(float*, float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_forward(double*, double*, const double*, int64_t, int64_t, int64_t, int64_t);
template void attention_backward(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t);
template void attention_backward(double*, const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                 int64_t);

}  // namespace ops

namespace {
constexpr size_t qkv_index = 0, proj_index = 1;
}

CausalSelfAttention::CausalSelfAttention(int64_t c, int64_t heads) : c_(c), heads_(heads) {
    if (heads < 1 || c % heads != 0)
        throw Error("fp8kit::nn::CausalSelfAttention: width " + std::to_string(c) + " is not a multiple of heads " +
                    std::to_string(heads));
    add_child("qkv", std::make_shared<Linear>(c, 3 * c));
    add_child("proj", std::make_shared<Linear>(c, c));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
    if (x.dim() != 3 || x.size(2) != c_)
        throw Error("fp8kit::nn::CausalSelfAttention::forward: x is " + to_string(x.shape()) + ", expected [B, T, " +
                    std::to_string(c_) + "]");
    const int64_t b = x.size(0), t = x.size(1);
    qkv_ = child<Linear>(qkv_index).forward(x).contiguous();  // [B, T, 3C]
    att_ = Tensor::empty({b, heads_, t, t}, DType::f32);
    Tensor y = Tensor::empty({b, t, c_}, DType::f32);
    ops::attention_forward(y.data<float>(), att_.data<float>(), qkv_.data<float>(), b, t, c_, heads_);
    return child<Linear>(proj_index).forward(y);
}

Tensor CausalSelfAttention::backward(const Tensor& dy) {
    if (!qkv_.defined()) throw Error("fp8kit::nn::CausalSelfAttention::backward: no forward to go back through");
    const Tensor dyc = child<Linear>(proj_index).backward(dy).contiguous();  // [B, T, C]
    const int64_t b = qkv_.size(0), t = qkv_.size(1);
    Tensor dqkv = Tensor::empty(qkv_.shape(), DType::f32);
    ops::attention_backward(dqkv.data<float>(), dyc.data<float>(), qkv_.data<float>(), att_.data<float>(), b, t, c_,
                            heads_);
    qkv_ = att_ = Tensor();
    return child<Linear>(qkv_index).backward(dqkv);
}

size_t CausalSelfAttention::saved_bytes() const { return qkv_.defined() ? qkv_.nbytes() + att_.nbytes() : 0; }

}  // namespace fp8kit::nn
