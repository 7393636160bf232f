// src/cpu/attention_avx2.cpp: attention_decode's inner loops (src/cpu/attention_kernel.hpp) on
// AVX2 + FMA + F16C, 8 float32 lanes: four keys' dot products side by side, bf16 / f16 widened
// eight at a time, a vector e^x, the value rows accumulated 32 columns at a time in registers.
// Only reached after cpuid says so (src/cpu/attention.cpp). Checked against the reference backend
// by tests/ops/test_attention.cpp, whose bound covers exp8's error.
#include <immintrin.h>

#include "cpu/attention_kernel.hpp"

namespace fp8kit::cpu {
namespace {

// x0 + ... + x7 in a fixed order: ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)).
inline float hsum(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// e^x for x <= 0 (a score minus its row's max): 0 below -87.3 (where e^x is below float32's
// normals; the row's sum holds e^0 = 1, so the absolute error < 2^-125 is nothing), NaN kept.
// x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts, the first with 16 bits so that n * part is
// exact), e^r by its Taylor series to r^7 (the remainder below 5e-9 relative, under half a float32
// ulp), times 2^n built in the exponent bits: within 2 ulp of e^x.
inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  // false for NaN
    x = _mm256_max_ps(lo, x);                                // NaN: the second operand, x
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

struct Avx2Ops {
    template <class T>
    static void widen(const T* src, float* dst, int64_t n) {
        int64_t i = 0;
        if constexpr (std::is_same_v<T, bf16>) {  // a bf16 is the high half of its float32
            for (; i + 8 <= n; i += 8) {
                const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
                _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
            }
        } else if constexpr (std::is_same_v<T, f16>) {
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
        } else {
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(reinterpret_cast<const float*>(src + i)));
        }
        for (; i < n; ++i) dst[i] = float(src[i]);
    }

    static void dot4(const float* x, const float* keys, int64_t n, float* y) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 q = _mm256_loadu_ps(x + i);
            a0 = _mm256_fmadd_ps(q, _mm256_loadu_ps(keys + i), a0);
            a1 = _mm256_fmadd_ps(q, _mm256_loadu_ps(keys + n + i), a1);
            a2 = _mm256_fmadd_ps(q, _mm256_loadu_ps(keys + 2 * n + i), a2);
            a3 = _mm256_fmadd_ps(q, _mm256_loadu_ps(keys + 3 * n + i), a3);
        }
        y[0] = hsum(a0), y[1] = hsum(a1), y[2] = hsum(a2), y[3] = hsum(a3);
        for (; i < n; ++i)
            for (int64_t k = 0; k < 4; ++k) y[k] += x[i] * keys[k * n + i];
    }

    static float exp_sum(float* p, int64_t n, float m) {
        const __m256 mv = _mm256_set1_ps(m);
        __m256 s = _mm256_setzero_ps();
        int64_t t = 0;
        for (; t + 8 <= n; t += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), mv));
            _mm256_storeu_ps(p + t, e);
            s = _mm256_add_ps(s, e);
        }
        float sum = hsum(s);
        if (t < n) {  // the tail through the same exp8, padded with -inf (e^-inf = 0)
            alignas(32) float tail[8];
            for (int64_t k = 0; k < 8; ++k) tail[k] = t + k < n ? p[t + k] : -std::numeric_limits<float>::infinity();
            _mm256_store_ps(tail, exp8(_mm256_sub_ps(_mm256_load_ps(tail), mv)));
            for (int64_t k = 0; t + k < n; ++k) sum += (p[t + k] = tail[k]);
        }
        return sum;
    }

    static void accumulate(float* acc, const float* p, const float* v, int64_t n, int64_t d, const uint8_t* mask) {
        int64_t i = 0;
        for (; i + 32 <= d; i += 32) {  // 32 columns of acc in four registers over the block's rows
            __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8);
            __m256 a2 = _mm256_loadu_ps(acc + i + 16), a3 = _mm256_loadu_ps(acc + i + 24);
            for (int64_t t = 0; t < n; ++t) {
                if (mask != nullptr && mask[t] == 0) continue;
                const __m256 e = _mm256_set1_ps(p[t]);
                const float* r = v + t * d + i;
                a0 = _mm256_fmadd_ps(e, _mm256_loadu_ps(r), a0);
                a1 = _mm256_fmadd_ps(e, _mm256_loadu_ps(r + 8), a1);
                a2 = _mm256_fmadd_ps(e, _mm256_loadu_ps(r + 16), a2);
                a3 = _mm256_fmadd_ps(e, _mm256_loadu_ps(r + 24), a3);
            }
            _mm256_storeu_ps(acc + i, a0), _mm256_storeu_ps(acc + i + 8, a1);
            _mm256_storeu_ps(acc + i + 16, a2), _mm256_storeu_ps(acc + i + 24, a3);
        }
        for (; i + 8 <= d; i += 8) {
            __m256 a = _mm256_loadu_ps(acc + i);
            for (int64_t t = 0; t < n; ++t)
                if (mask == nullptr || mask[t] != 0) a = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + t * d + i), a);
            _mm256_storeu_ps(acc + i, a);
        }
        for (; i < d; ++i)
            for (int64_t t = 0; t < n; ++t)
                if (mask == nullptr || mask[t] != 0) acc[i] += p[t] * v[t * d + i];
    }
};

}  // namespace

void attention_decode_avx2(const detail::AttentionDecodeJob& j) {
    detail::with_storage_type(j.dtype, [&]<class T>(T) { attention_decode_rows<T, Avx2Ops>(j); });
}

}  // namespace fp8kit::cpu
