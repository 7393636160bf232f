// src/cpu/gemm_avx2_small.cpp: the AVX2 + FMA GEMM kernel for few rows of A (M <= small_m_max of
// the avx2 kernels, gemm_avx2.cpp): B's codes decoded in registers (PairRow) and streamed once, in
// passes of up to 6 rows. Built with -mavx2 -mfma (and, on GCC, one register-allocation region:
// CMakeLists.txt says why). Checked against the reference backend, float64 and the tile kernel
// by tests/ops/test_gemm.cpp (SmallMKernelsSumAsTheTiles, SmallMOffsetKeepsD, the avx2 path).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/gemm_kernels.hpp"
#include "cpu/pair_row_avx2.hpp"

namespace fp8kit::cpu {

namespace {

// 16 columns in PairRow's order (even columns, odd columns) back in column order: unpack
// interleaves within 128-bit halves (columns 0-3 | 8-11 and 4-7 | 12-15), permute2f128 joins
// the halves.
void column_order(__m256 even, __m256 odd, __m256& c0_7, __m256& c8_15) {
    const __m256 a = _mm256_unpacklo_ps(even, odd), b = _mm256_unpackhi_ps(even, odd);
    c0_7 = _mm256_permute2f128_ps(a, b, 0x20);
    c8_15 = _mm256_permute2f128_ps(a, b, 0x31);
}

// ---- small M: B's codes widened in registers, streamed once ----
// Strip s of B times R rows of A (af, float32) into out[r * ldacc + col]. Offset: af holds A times
// 2^(127 - bias - c) and B is decoded without its multiply (PairRow), so each group's sums are the
// exact ones times 2^-c, and undo = 2^c takes them back (small_format says why that is exact).
template <Format F, int R, bool Checked, bool Offset>
void small_strip(const float* af, int64_t ldaf, const PackedB& b, int64_t s, const float* sa, float undo,
                 const ExpandTable& t, float* out, int64_t ldacc) {
    const KLayout& kl = b.kl;
    const int64_t cpg = kl.chunks_per_group();
    const bool one_group = kl.groups == 1;
    const uint8_t* codes = b.strip(s);
    // Accumulators a row: for R <= 2 four (even and odd columns, elements 0 and 1 of the pairs
    // apart, added when the group ends), whose 4R chains of dependent FMAs keep the FMA pipes
    // busy; for R >= 3 two (even and odd columns, each pair's element 0 then element 1: the
    // tiles' K order, bit for bit), 2R chains, as many as the 16 registers hold at R = 6 with one
    // element of B and A's value broadcast. (Two accumulators at R = 2 ran 0.81x four.)
    constexpr int C = R <= 2 ? 4 : 2;
    for (int64_t g = 0; g < kl.groups; ++g) {
        __m256 lanes[R][C];
        for (int r = 0; r < R; ++r) {
            for (int v = 0; v < C; ++v) lanes[r][v] = _mm256_setzero_ps();
        }
        for (int64_t q = g * cpg; q < (g + 1) * cpg; ++q) {
            const uint8_t* chunk = codes + q * gemm_chunk_codes;
            // Every line of the chunk 8 ahead (4 KiB): the hardware prefetcher alone, or one
            // line in four, left M = 1 at 2/3 of its in-cache speed out of cache.
            for (int line = 0; line < gemm_chunk_codes / 64; ++line) {
                _mm_prefetch(reinterpret_cast<const char*>(chunk + 8 * gemm_chunk_codes + line * 64), _MM_HINT_T0);
            }
            for (int p = 0; p < gemm_chunk / 2; ++p) {
                FP8KIT_UNROLL(2)
                for (int e = 0; e < 2; ++e) {
                    __m256 w[2];  // element e: even columns, odd columns
                    PairRow<F>::template decode_element<Checked, Offset>(chunk + p * 2 * gemm_tile, e, t, w);
                    const int v = C == 4 ? e : 0;  // C = 4: element e's lanes e (even), 2 + e (odd)
                    FP8KIT_UNROLL(6)
                    for (int r = 0; r < R; ++r) {
                        const __m256 a = _mm256_broadcast_ss(af + r * ldaf + q * gemm_chunk + 2 * p + e);
                        lanes[r][v] = _mm256_fmadd_ps(a, w[0], lanes[r][v]);
                        lanes[r][v + C / 2] = _mm256_fmadd_ps(a, w[1], lanes[r][v + C / 2]);
                    }
                }
            }
        }
        const __m256 sb0 = _mm256_loadu_ps(b.sb(s, g));
        const __m256 sb1 = _mm256_loadu_ps(b.sb(s, g) + 8);
        for (int r = 0; r < R; ++r) {
            // Per column: element 0's sum plus element 1's (C = 4; NUMERICS.md), or the K-order sum.
            __m256 part[2];
            if constexpr (C == 4) {
                column_order(_mm256_add_ps(lanes[r][0], lanes[r][1]), _mm256_add_ps(lanes[r][2], lanes[r][3]), part[0], part[1]);
            } else {
                column_order(lanes[r][0], lanes[r][1], part[0], part[1]);
            }
            if constexpr (Offset) {
                part[0] = _mm256_mul_ps(part[0], _mm256_set1_ps(undo));
                part[1] = _mm256_mul_ps(part[1], _mm256_set1_ps(undo));
            }
            // The running total in out, not in registers (the accumulators need them all):
            // partial * (sa * sb), fused into the total after the first group - promote_loop's
            // operations, in its order; one group: the sums, scaled in the epilogue.
            float* o = out + r * ldacc;
            if (one_group) {
                _mm256_storeu_ps(o, part[0]);
                _mm256_storeu_ps(o + 8, part[1]);
                continue;
            }
            const __m256 s_a = _mm256_set1_ps(sa[r * kl.groups + g]);
            const __m256 x0 = _mm256_mul_ps(s_a, sb0), x1 = _mm256_mul_ps(s_a, sb1);
            _mm256_storeu_ps(o, g == 0 ? _mm256_mul_ps(part[0], x0) : _mm256_fmadd_ps(part[0], x0, _mm256_loadu_ps(o)));
            _mm256_storeu_ps(o + 8, g == 0 ? _mm256_mul_ps(part[1], x1) : _mm256_fmadd_ps(part[1], x1, _mm256_loadu_ps(o + 8)));
        }
    }
}

// Strip s times R rows (the decode's checked reading only where the strip holds a NaN or Inf
// code, and for strip 0: PairRow::decode_element).
template <Format F, int R, bool Offset>
void small_rows(const float* af, int64_t ldaf, const PackedB& b, int64_t s, const float* sa, float undo,
                const ExpandTable& t, float* out, int64_t ldacc) {
    if (s == 0 || b.strip_nonfinite[size_t(s)]) {
        small_strip<F, R, true, Offset>(af, ldaf, b, s, sa, undo, t, out, ldacc);
    } else {
        small_strip<F, R, false, Offset>(af, ldaf, b, s, sa, undo, t, out, ldacc);
    }
}

// Strip by strip, in passes of up to 6 rows, as even as the rows allow (7 = 4 + 3, 16 = 6 + 5 +
// 5, 24 = 6 x 4): each pass decodes the strip again, so the more rows a pass the less decoding a
// flop. A strip's codes (16 bytes a K) come from memory once, for the first pass, and from L2 for
// the others - rows outermost streamed all of B once per pass.
template <Format F, bool Offset>
void small_all_rows(int64_t rows, const float* af, int64_t ldaf, const PackedB& b, int64_t s0, int64_t s1,
                    const float* sa, float undo, const ExpandTable& t, float* acc, int64_t ldacc) {
    const int64_t groups = b.kl.groups;
    for (int64_t s = s0; s < s1; ++s) {
        float* out = acc + (s - s0) * gemm_tile;
        const int64_t passes = (rows + 5) / 6;
        int64_t r = 0;
        for (int64_t pass = 0; pass < passes; ++pass) {
            const int64_t take = rows / passes + (pass < rows % passes ? 1 : 0);
            const float* ar = af + r * ldaf;
            const float* sr = sa + r * groups;
            float* o = out + r * ldacc;
            switch (take) {
                case 6: small_rows<F, 6, Offset>(ar, ldaf, b, s, sr, undo, t, o, ldacc); break;
                case 5: small_rows<F, 5, Offset>(ar, ldaf, b, s, sr, undo, t, o, ldacc); break;
                case 4: small_rows<F, 4, Offset>(ar, ldaf, b, s, sr, undo, t, o, ldacc); break;
                case 3: small_rows<F, 3, Offset>(ar, ldaf, b, s, sr, undo, t, o, ldacc); break;
                case 2: small_rows<F, 2, Offset>(ar, ldaf, b, s, sr, undo, t, o, ldacc); break;
                default: small_rows<F, 1, Offset>(ar, ldaf, b, s, sr, undo, t, o, ldacc); break;
            }
            r += take;
        }
    }
}

// The c of small_strip's offset for A's values (largest finite magnitude a_max, smallest nonzero
// a_min) against B in format F, or -1 where none keeps D. A times 2^(127 - bias - c) must stay
// finite: c = 0 while a_max < 2^bias (then every product, so every sum, is the one without the
// offset), else the least c that keeps it below 2^127. With c > 0 the sums are the exact ones
// times 2^-c, rounded the same, while none leaves the normals: every product, so every float32
// sum of them, is a multiple of ulp(a_min) (a bf16: 8 significant bits) times B's quantum (its
// smallest subnormal), which times 2^-c must be at least 2^-126; and none of the exact sums may
// overflow (an Inf that later terms would not undo where 2^-c had kept it finite): the sum of
// |a b| over K is below 2^127.
template <Format F>
int offset_shift(float a_max, float a_min, int64_t k) {
    constexpr FormatInfo fi = format_info(F);
    int e_max = 0, e_min = 0;
    std::frexp(a_max, &e_max);  // a_max < 2^e_max (0 for a zero A)
    const int c = std::max(0, e_max + (127 - fi.bias) - 127);
    if (c == 0) return 0;
    std::frexp(a_min, &e_min);  // ulp(a_min) = 2^(e_min - 8)
    const int quantum_b = std::ilogb(fi.min_subnormal);
    if (e_min - 8 + quantum_b - c < -126 || double(k) * a_max * fi.max >= 0x1p127) return -1;
    return c;
}

template <Format F>
void small_format(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
                  const float* sa, const ExpandTable& t, float* acc, int64_t ldacc) {
    // A's few rows widened to float32 once per call (exact), so each K value is one broadcast, with
    // their largest finite and smallest nonzero magnitudes (NaN compares false: in neither).
    const int64_t ldaf = b.kl.padded;  // a multiple of 32
    std::vector<float> afv(size_t(rows * ldaf));
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    __m256 most = _mm256_setzero_ps(), least = inf;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < ldaf; k += 8) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + r * lda + k));
            const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            _mm256_storeu_ps(afv.data() + r * ldaf + k, v);
            const __m256 m = _mm256_and_ps(v, magnitude);
            most = _mm256_max_ps(most, _mm256_and_ps(m, _mm256_cmp_ps(m, inf, _CMP_LT_OQ)));
            least = _mm256_min_ps(least, _mm256_blendv_ps(inf, m, _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GT_OQ)));
        }
    }
    alignas(32) float lanes_max[8], lanes_min[8];
    _mm256_store_ps(lanes_max, most);
    _mm256_store_ps(lanes_min, least);
    const float a_max = *std::max_element(lanes_max, lanes_max + 8), a_min = *std::min_element(lanes_min, lanes_min + 8);
    // B's decode without its multiply runs 1.2x faster (M = 1-4, one Zen 3 core, codes in cache):
    // it is most of the kernel's work. A, a few rows, takes the multiply instead where that is exact.
    const int c = offset_shift<F>(a_max, a_min, b.kl.k);
    if (c < 0) return small_all_rows<F, false>(rows, afv.data(), ldaf, b, s0, s1, sa, 1.0f, t, acc, ldacc);
    const float to_a = std::ldexp(1.0f, 127 - format_info(F).bias - c);
    for (float& v : afv) v *= to_a;
    small_all_rows<F, true>(rows, afv.data(), ldaf, b, s0, s1, sa, std::ldexp(1.0f, c), t, acc, ldacc);
}

}  // namespace

void small_avx2(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
                const float* sa, const ExpandTable& t, bool /*fold: never asked (no GemmKernels::fold here)*/, float* acc,
                int64_t ldacc) {
    const DenormalsRead read;
    switch (b.format) {
        case Format::e4m3fn: return small_format<Format::e4m3fn>(rows, a, lda, b, s0, s1, sa, t, acc, ldacc);
        case Format::e5m2: return small_format<Format::e5m2>(rows, a, lda, b, s0, s1, sa, t, acc, ldacc);
        case Format::e4m3fnuz: return small_format<Format::e4m3fnuz>(rows, a, lda, b, s0, s1, sa, t, acc, ldacc);
        default: return small_format<Format::e5m2fnuz>(rows, a, lda, b, s0, s1, sa, t, acc, ldacc);
    }
}

}  // namespace fp8kit::cpu
