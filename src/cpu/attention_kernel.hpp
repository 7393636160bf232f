// src/cpu/attention_kernel.hpp: the cpu backend's attention over a key/value cache
// (attention_decode): the loop over a task's key blocks with the online softmax, on an Ops policy
// for its inner loops - PortableOps here (plain C++, std::exp; src/cpu/attention.cpp), Avx2Ops in
// src/cpu/attention_avx2.cpp (AVX2 + FMA intrinsics, a vector exp). Each translation unit has its
// own copy (the namespace is anonymous). Scores, softmax and sums in float32, each row's sums in a
// fixed order, so the result does not depend on the thread count. Checked against the reference
// backend by tests/ops/test_attention.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

#if defined(FP8KIT_X86_KERNELS)
void attention_decode_avx2(const detail::AttentionDecodeJob& j);  // src/cpu/attention_avx2.cpp
#endif

namespace {

// ---- attention_decode ----
// A decode step reads the whole cache for one new position, so the cache's bytes bound it. One
// task is a (batch, key/value head) with up to decode_rows of its query rows (its G query heads x S
// positions): it reads each key and value row once for all of them, decode_keys keys at a time,
// with the softmax online (a running max and sum per row; the accumulators rescaled once a block).
// Blocks where every row's mask is false are not read (a StaticCache's unwritten tail).
constexpr int64_t decode_keys = 64, decode_rows = 16;
// A decode step's attention goes parallel at a sixteenth of the layer ops' threshold
// (parallel_min_work): it streams a cache that a step reads once, cold (two threads draw more of
// it from memory than one), and in a model it runs between GEMMs whose threads are still awake.
constexpr int64_t decode_parallel_min_work = parallel_min_work / 16;

// The inner loops in plain C++ (any CPU), one multiply-add chain at a time:
//   widen(src, dst, n)           dst[n] = float(src[n])
//   dot4(x, keys, n, y)          y[k] = x . keys[k * n, (k + 1) * n) for k < 4
//   exp_sum(p, n, m)             p[t] = e^(p[t] - m) for t < n (p[t] <= m, or NaN); returns their sum
//   accumulate(acc, p, v, n, d, mask)  acc[d] += sum over t < n with mask[t] (null: all) of p[t] v[t * d, (t + 1) * d)
struct PortableOps {
    template <class T>
    static void widen(const T* src, float* dst, int64_t n) {
        for (int64_t i = 0; i < n; ++i) dst[i] = float(src[i]);
    }
    static void dot4(const float* x, const float* keys, int64_t n, float* y) {
        for (int64_t k = 0; k < 4; ++k) {
            float a = 0.0f;
            for (int64_t i = 0; i < n; ++i) a += x[i] * keys[k * n + i];
            y[k] = a;
        }
    }
    static float exp_sum(float* p, int64_t n, float m) {
        float s = 0.0f;
        for (int64_t t = 0; t < n; ++t) s += (p[t] = std::exp(p[t] - m));
        return s;
    }
    static void accumulate(float* acc, const float* p, const float* v, int64_t n, int64_t d, const uint8_t* mask) {
        for (int64_t t = 0; t < n; ++t) {
            if (mask != nullptr && mask[t] == 0) continue;
            for (int64_t i = 0; i < d; ++i) acc[i] += p[t] * v[t * d + i];
        }
    }
};

// A block's tn rows of keys or values [tn, d] as float32: float32 rows where they are (a decode
// step reads the cache once, not once and again as a copy), unless padded - dot4's four keys at a
// time read up to 3 rows past tn, which past the cache's last row are not its memory - else widened
// into blk, padded with zeros to a multiple of 4 rows (their dots are not read, but computed).
template <class Ops, class T>
const float* block_rows(const T* rows, int64_t tn, int64_t d, bool padded, float* blk) {
    if constexpr (std::is_same_v<T, float>) {
        if (!padded) return rows;
    }
    Ops::widen(rows, blk, tn * d);
    if (padded) std::fill(blk + tn * d, blk + (tn + 3) / 4 * 4 * d, 0.0f);
    return blk;
}

// Rows [r0, r0 + rn) of (batch b, key/value head kh); row r is query head kh * G + r / S at
// position r % S.
template <class T, class Ops>
void decode_task(const detail::AttentionDecodeJob& j, int64_t b, int64_t kh, int64_t r0, int64_t rn) {
    const int64_t g = j.hq / j.hkv, d = j.d, l = j.l, n_s = j.s;
    const float scale = float(j.scale);
    const auto buf = std::make_unique_for_overwrite<float[]>(size_t(rn * (2 * d + decode_keys + 2) + (decode_keys + 3) * d));
    float* qf = buf.get();              // [rn, d] scale * q
    float* acc = qf + rn * d;           // [rn, d] sum of e^(s - max) v
    float* sc = acc + rn * d;           // [rn, decode_keys] scores, then e^(s - max)
    float* mx = sc + rn * decode_keys;  // [rn] running max
    float* sum = mx + rn;               // [rn] running sum of e^(s - max)
    float* blk = sum + rn;              // [decode_keys (+ 3 of padding for dot4), d] a block's keys or values widened
    const uint8_t* mrow[decode_rows];   // [rn] each row's mask [l], or null
    int64_t h[decode_rows], pos[decode_rows];
    for (int64_t r = 0; r < rn; ++r) {
        h[r] = kh * g + (r0 + r) / n_s;
        pos[r] = (r0 + r) % n_s;
        Ops::widen(static_cast<const T*>(j.q) + ((b * j.hq + h[r]) * n_s + pos[r]) * d, qf + r * d, d);
        for (int64_t i = 0; i < d; ++i) qf[r * d + i] *= scale;
        mrow[r] = j.mask ? j.mask + ((j.mask_b == 1 ? 0 : b) * n_s + pos[r]) * l : nullptr;
        std::fill(acc + r * d, acc + (r + 1) * d, 0.0f);
        mx[r] = -std::numeric_limits<float>::infinity();
        sum[r] = 0.0f;
    }
    const auto attended = [&](int64_t r, int64_t t) { return mrow[r] == nullptr || mrow[r][t] != 0; };
    const T* kb = static_cast<const T*>(j.k) + (b * j.hkv + kh) * l * d;  // [l, d]
    const T* vb = static_cast<const T*>(j.v) + (b * j.hkv + kh) * l * d;  // [l, d]
    for (int64_t t0 = 0; t0 < l; t0 += decode_keys) {
        const int64_t tn = std::min(decode_keys, l - t0);
        bool any = j.mask == nullptr;
        for (int64_t r = 0; r < rn && !any; ++r)
            for (int64_t t = 0; t < tn && !any; ++t) any = attended(r, t0 + t);
        if (!any) continue;
        const float* keys = block_rows<Ops>(kb + t0 * d, tn, d, tn % 4 != 0, blk);
        for (int64_t r = 0; r < rn; ++r) {
            float* p = sc + r * decode_keys;
            for (int64_t t = 0; t < tn; t += 4) {  // past tn: the padding's dots, not read
                float y[4];
                Ops::dot4(qf + r * d, keys + t * d, d, y);
                for (int64_t k = 0; k < 4 && t + k < tn; ++k) p[t + k] = attended(r, t0 + t + k) ? y[k] : -std::numeric_limits<float>::infinity();
            }
            float bm = -std::numeric_limits<float>::infinity();
            for (int64_t t = 0; t < tn; ++t) bm = std::max(bm, p[t]);  // a NaN score reaches out through its e^(s - max)
            if (bm == -std::numeric_limits<float>::infinity()) continue;  // nothing of this block attended by row r
            const float m = std::max(mx[r], bm), corr = std::exp(mx[r] - m);
            sum[r] = sum[r] * corr + Ops::exp_sum(p, tn, m);
            for (int64_t i = 0; i < d; ++i) acc[r * d + i] *= corr;
            mx[r] = m;
        }
        const float* values = block_rows<Ops>(vb + t0 * d, tn, d, false, blk);
        for (int64_t r = 0; r < rn; ++r)  // a masked value is not read into the sum, whatever it holds
            Ops::accumulate(acc + r * d, sc + r * decode_keys, values, tn, d, mrow[r] ? mrow[r] + t0 : nullptr);
    }
    for (int64_t r = 0; r < rn; ++r) {
        T* o = static_cast<T*>(j.out) + ((b * n_s + pos[r]) * j.hq + h[r]) * d;  // [d]
        for (int64_t i = 0; i < d; ++i) o[i] = T(sum[r] == 0.0f ? 0.0f : acc[r * d + i] / sum[r]);
    }
}

template <class T, class Ops>
void attention_decode_rows(const detail::AttentionDecodeJob& j) {
    const int64_t rows = j.hq / j.hkv * j.s, chunks = (rows + decode_rows - 1) / decode_rows;
    const int64_t tasks = j.b * j.hkv * chunks;
#pragma omp parallel for schedule(static) if (tasks > 1 && j.b * j.hq * j.s * j.l * j.d > decode_parallel_min_work)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t c = task % chunks, kh = task / chunks % j.hkv, b = task / chunks / j.hkv;
        decode_task<T, Ops>(j, b, kh, c * decode_rows, std::min(decode_rows, rows - c * decode_rows));
    }
}

}  // namespace
}  // namespace fp8kit::cpu
