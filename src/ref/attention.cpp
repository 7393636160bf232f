// src/ref/attention.cpp: the reference causal self-attention - plain loops in float64, each
// output rounded once: the forward's out from the unrounded probabilities, the backward's dq, dk,
// dv each one float64 sum - and the reference attention over a key/value cache (attention_decode:
// float64, out rounded to float32 and then to the dtype). The ground truth of
// tests/ops/test_attention.cpp; the backward is checked by finite differences in
// tests/ops/test_backward.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

template <class T>
void attention_fwd(const detail::AttentionJob& j) {
    const T* qkv = static_cast<const T*>(j.qkv);
    const int64_t t = j.t, c = j.c, hs = c / j.nh;
    const double scale = 1.0 / std::sqrt(double(hs));
    std::vector<double> p(static_cast<size_t>(t));
    for (int64_t b = 0; b < j.b; ++b) {
        for (int64_t h = 0; h < j.nh; ++h) {
            for (int64_t t1 = 0; t1 < t; ++t1) {
                const T* q = qkv + (b * t + t1) * 3 * c + h * hs;
                double maxv = -std::numeric_limits<double>::infinity();
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const T* k = qkv + (b * t + t2) * 3 * c + c + h * hs;
                    double s = 0.0;
                    for (int64_t i = 0; i < hs; ++i) s += double(q[i]) * double(k[i]);
                    p[size_t(t2)] = s * scale;
                    maxv = std::max(maxv, p[size_t(t2)]);
                }
                double sum = 0.0;
                for (int64_t t2 = 0; t2 <= t1; ++t2) sum += (p[size_t(t2)] = std::exp(p[size_t(t2)] - maxv));
                T* a = static_cast<T*>(j.att) + ((b * j.nh + h) * t + t1) * t;
                for (int64_t t2 = 0; t2 < t; ++t2) {
                    if (t2 <= t1) p[size_t(t2)] /= sum;
                    a[t2] = t2 <= t1 ? T(p[size_t(t2)]) : T(0);
                }
                T* o = static_cast<T*>(j.out) + (b * t + t1) * c + h * hs;
                for (int64_t i = 0; i < hs; ++i) {
                    double acc = 0.0;
                    for (int64_t t2 = 0; t2 <= t1; ++t2) acc += p[size_t(t2)] * double(qkv[(b * t + t2) * 3 * c + 2 * c + h * hs + i]);
                    o[i] = T(acc);
                }
            }
        }
    }
}

// With a = att (the saved probabilities), g = dout, per head:
//   dv[t2] = sum_{t1 >= t2} a[t1, t2] g[t1];  datt[t1, t2] = g[t1] . v[t2]
//   ds[t1, t2] = a[t1, t2] (datt[t1, t2] - sum_t a[t1, t] datt[t1, t]) / sqrt(hs)
//   dq[t1] = sum_t2 ds[t1, t2] k[t2];  dk[t2] = sum_t1 ds[t1, t2] q[t1]
template <class T>
void attention_bwd(const detail::AttentionJob& j) {
    const T* qkv = static_cast<const T*>(j.qkv);
    const T* att = static_cast<const T*>(j.saved_att);
    const T* dout = static_cast<const T*>(j.dout);
    const int64_t t = j.t, c = j.c, hs = c / j.nh;
    const double scale = 1.0 / std::sqrt(double(hs));
    std::vector<double> d(size_t(t * 3 * hs)), datt(static_cast<size_t>(t));  // [t][q, k, v][hs]
    for (int64_t b = 0; b < j.b; ++b) {
        for (int64_t h = 0; h < j.nh; ++h) {
            std::fill(d.begin(), d.end(), 0.0);
            const auto at = [&](int64_t tt, int64_t part) { return qkv + (b * t + tt) * 3 * c + part * c + h * hs; };
            for (int64_t t1 = 0; t1 < t; ++t1) {
                const T* a = att + ((b * j.nh + h) * t + t1) * t;
                const T* g = dout + (b * t + t1) * c + h * hs;
                double dot_a = 0.0;
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    double s = 0.0;
                    for (int64_t i = 0; i < hs; ++i) {
                        s += double(g[i]) * double(at(t2, 2)[i]);
                        d[size_t((t2 * 3 + 2) * hs + i)] += double(a[t2]) * double(g[i]);
                    }
                    datt[size_t(t2)] = s;
                    dot_a += double(a[t2]) * s;
                }
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const double ds = double(a[t2]) * (datt[size_t(t2)] - dot_a) * scale;
                    for (int64_t i = 0; i < hs; ++i) {
                        d[size_t((t1 * 3 + 0) * hs + i)] += ds * double(at(t2, 1)[i]);
                        d[size_t((t2 * 3 + 1) * hs + i)] += ds * double(at(t1, 0)[i]);
                    }
                }
            }
            for (int64_t tt = 0; tt < t; ++tt)
                for (int64_t part = 0; part < 3; ++part)
                    for (int64_t i = 0; i < hs; ++i)
                        static_cast<T*>(j.dqkv)[(b * t + tt) * 3 * c + part * c + h * hs + i] = T(d[size_t((tt * 3 + part) * hs + i)]);
        }
    }
}

// Per query row: scores s_j = scale q . k_j over the attended keys, out = sum_j e^(s_j - max) v_j /
// sum_j e^(s_j - max); 0 where no key is attended.
template <class T>
void attention_dec(const detail::AttentionDecodeJob& j) {
    const T* q = static_cast<const T*>(j.q);
    const T* k = static_cast<const T*>(j.k);
    const T* v = static_cast<const T*>(j.v);
    T* out = static_cast<T*>(j.out);
    const int64_t g = j.hq / j.hkv, d = j.d, l = j.l;
    std::vector<double> p(static_cast<size_t>(l)), acc(static_cast<size_t>(d));
    for (int64_t b = 0; b < j.b; ++b)
        for (int64_t h = 0; h < j.hq; ++h)
            for (int64_t s = 0; s < j.s; ++s) {
                const T* qr = q + ((b * j.hq + h) * j.s + s) * d;                      // [d]
                const T* kh = k + (b * j.hkv + h / g) * l * d;                         // [l, d]
                const T* vh = v + (b * j.hkv + h / g) * l * d;                         // [l, d]
                const uint8_t* m = j.mask ? j.mask + ((j.mask_b == 1 ? 0 : b) * j.s + s) * l : nullptr;  // [l]
                double maxv = -std::numeric_limits<double>::infinity(), sum = 0.0;
                for (int64_t t = 0; t < l; ++t) {
                    if (m && !m[t]) continue;
                    double dot = 0.0;
                    for (int64_t i = 0; i < d; ++i) dot += double(float(qr[i])) * double(float(kh[t * d + i]));
                    p[size_t(t)] = dot * j.scale;
                    maxv = std::max(maxv, p[size_t(t)]);  // a NaN score reaches out through its e^(s - max)
                }
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int64_t t = 0; t < l; ++t) {
                    if (m && !m[t]) continue;
                    const double e = std::exp(p[size_t(t)] - maxv);
                    sum += e;
                    for (int64_t i = 0; i < d; ++i) acc[size_t(i)] += e * double(float(vh[t * d + i]));
                }
                T* o = out + ((b * j.s + s) * j.hq + h) * d;
                for (int64_t i = 0; i < d; ++i) o[i] = T(sum == 0.0 ? 0.0f : float(acc[size_t(i)] / sum));
            }
}

}  // namespace

void attention_decode(const detail::AttentionDecodeJob& j) {
    detail::with_storage_type(j.dtype, [&]<class T>(T) { attention_dec<T>(j); });
}

void attention_forward(const detail::AttentionJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { attention_fwd<T>(j); });
}
void attention_backward(const detail::AttentionJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { attention_bwd<T>(j); });
}

}  // namespace fp8kit::ref
