// src/cpu/attention.cpp: the cpu backend's causal self-attention core (as llm.c): scores, causal
// softmax and the weighted sum, and the backward. Scores and softmax sums in double; the
// probabilities and outputs rounded to the tensor's precision; the backward adds float terms
// into dq, dk, dv in a fixed order. Each (batch, head) is one thread's, so results do not depend
// on the thread count. And the attention of new positions over a key/value cache
// (attention_decode): src/cpu/attention_kernel.hpp, built here for any CPU and in
// src/cpu/attention_avx2.cpp for AVX2 + FMA, chosen by the active ISA. Checked against the
// reference backend by tests/ops/test_attention.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops.hpp"
#include "cpu/attention_kernel.hpp"
#include "cpu/layer_parallel.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void attention_fwd(const detail::AttentionJob& j) {
    T* out = static_cast<T*>(j.out);
    T* att = static_cast<T*>(j.att);
    const T* qkv = static_cast<const T*>(j.qkv);
    const int64_t b = j.b, t = j.t, c = j.c, nh = j.nh;
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
void attention_bwd(const detail::AttentionJob& j) {
    T* dqkv = static_cast<T*>(j.dqkv);
    const T* dout = static_cast<const T*>(j.dout);
    const T* qkv = static_cast<const T*>(j.qkv);
    const T* att = static_cast<const T*>(j.saved_att);
    const int64_t b = j.b, t = j.t, c = j.c, nh = j.nh;
    const int64_t hs = c / nh;
    const double scale = 1.0 / std::sqrt(double(hs));
    // Each (batch, head) writes only its own slices of dq, dk, dv: no two iterations share an output.
#pragma omp parallel for schedule(static) collapse(2) if (b * t * t * c > 16 * parallel_min_work)
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < nh; ++h) {
            for (int64_t t1 = 0; t1 < t; ++t1)
                for (int64_t jj = 0; jj < 3; ++jj)
                    for (int64_t i = 0; i < hs; ++i) dqkv[(bb * t + t1) * 3 * c + jj * c + h * hs + i] = T(0);
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

}  // namespace

void attention_decode(const detail::AttentionDecodeJob& j) {
#if defined(FP8KIT_X86_KERNELS)
    if (active_isa() != Isa::portable) return attention_decode_avx2(j);
#endif
    detail::with_storage_type(j.dtype, [&]<class T>(T) { attention_decode_rows<T, PortableOps>(j); });
}

void attention_forward(const detail::AttentionJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { attention_fwd<T>(j); });
}
void attention_backward(const detail::AttentionJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { attention_bwd<T>(j); });
}

}  // namespace fp8kit::cpu
