// src/cpu/convert_avx512.cpp: the conversion kernels on AVX-512 (F, BW, DQ, VL), 16 lanes.
// Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl; only reached after cpuid says so.
// Checked against the scalar functions over all 2^32 float32 inputs (test_convert_exhaustive).
#include <immintrin.h>

#include "cpu/convert_simd.hpp"

namespace fp8kit::cpu {
namespace {

struct Avx512 {
    static constexpr size_t W = 16;
    using I = __m512i;
    using F = __m512;
    using Mask = __mmask16;

    static I set1(uint32_t v) { return _mm512_set1_epi32(int(v)); }
    static F set1f(float v) { return _mm512_set1_ps(v); }
    static I as_i(F v) { return _mm512_castps_si512(v); }
    static F as_f(I v) { return _mm512_castsi512_ps(v); }
    static I add(I a, I b) { return _mm512_add_epi32(a, b); }
    static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
    static I and_(I a, I b) { return _mm512_and_si512(a, b); }
    static I or_(I a, I b) { return _mm512_or_si512(a, b); }
    template <int K> static I srli(I a) { return _mm512_srli_epi32(a, K); }
    template <int K> static I slli(I a) { return _mm512_slli_epi32(a, K); }
    static I min_u(I a, I b) { return _mm512_min_epu32(a, b); }
    static I max_u(I a, I b) { return _mm512_max_epu32(a, b); }
    static uint32_t hmax(I a) { return _mm512_reduce_max_epu32(a); }
    // Lane g = hmax(r[g]): the 16 registers' maxima as one, halving the lanes that each holds a
    // partial max of (16 registers of 16, 8 of 2 x 8, 4 of 4 x 4, 2 of 8 x 2, 1 of 16 x 1).
    static I hmax_lanes(const I* r) {
        I s[8], u[4], v[2];
        for (int i = 0; i < 8; ++i) {  // s[i]: 256-bit half h = r[2i + h]'s partial
            const I a = r[2 * i], b = r[2 * i + 1];
            s[i] = max_u(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
        }
        for (int j = 0; j < 4; ++j) {  // u[j]: quarter k = r[4j + k]'s partial
            const I a = s[2 * j], b = s[2 * j + 1];
            u[j] = max_u(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
        }
        for (int j = 0; j < 2; ++j) {  // v[j]: quarter k = [r[8j + k] x 2, r[8j + 4 + k] x 2]
            v[j] = max_u(_mm512_unpacklo_epi64(u[2 * j], u[2 * j + 1]), _mm512_unpackhi_epi64(u[2 * j], u[2 * j + 1]));
        }
        // quarter k = [r[k], r[4 + k], r[8 + k], r[12 + k]], then in order
        const F a = as_f(v[0]), b = as_f(v[1]);
        const I m = max_u(as_i(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), as_i(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
        return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), m);
    }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F cvt_f(I a) { return _mm512_cvtepi32_ps(a); }
    static I round_i(F a) {
        return _mm512_cvt_roundps_epi32(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    // Signed compares: every value compared is below 2^31 or deliberately signed.
    static Mask lt(I a, I b) { return _mm512_cmplt_epi32_mask(a, b); }
    static Mask gt(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
    static Mask eq(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
    static Mask mask_or(Mask a, Mask b) { return Mask(a | b); }
    static I select(Mask m, I a, I b) { return _mm512_mask_blend_epi32(m, b, a); }

    static F load(const float* p) { return _mm512_loadu_ps(p); }
    static F load(const bf16* p) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return as_f(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static F load(const f16* p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
    static I load_i(const uint32_t* p) { return _mm512_loadu_si512(p); }
    static void store_i(uint32_t* p, I v) { _mm512_storeu_si512(p, v); }
    static I load_u8(const uint8_t* p) {
        return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }

    static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
    // 16-bit outputs: two registers (32 values) per 64-byte store.
    static I halves(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
    static I bf16_pair(F a, F b) {
        return halves(_mm512_cvtepi32_epi16(bf16_bits<Avx512>(a)), _mm512_cvtepi32_epi16(bf16_bits<Avx512>(b)));
    }
    static I f16_pair(F a, F b) {
        constexpr int rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        return halves(_mm512_cvtps_ph(a, rn), _mm512_cvtps_ph(b, rn));
    }
    static void store(bf16* p, F a, F b) { _mm512_storeu_si512(p, bf16_pair(a, b)); }
    static void store(f16* p, F a, F b) { _mm512_storeu_si512(p, f16_pair(a, b)); }
    // Full 64-byte lines, non-temporal; p is 64-byte aligned (run_blocks guarantees it).
    static void store_streaming(float* p, F v) { _mm512_stream_ps(p, v); }
    static void store_streaming(bf16* p, F a, F b) { _mm512_stream_si512(reinterpret_cast<__m512i*>(p), bf16_pair(a, b)); }
    static void store_streaming(f16* p, F a, F b) { _mm512_stream_si512(reinterpret_cast<__m512i*>(p), f16_pair(a, b)); }
    static void fence() { _mm_sfence(); }
    // One 64-byte line from an aligned buffer to an aligned destination, non-temporal.
    static void stream_line(uint8_t* dst, const uint8_t* src) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_load_si512(src));
    }

    // One register of codes (each lane 0..255) to 16 bytes.
    static void store_u8(uint8_t* p, I c) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(c)); }
    // Four registers of codes (each lane 0..255) to 64 bytes in order.
    static void store_u8x4(uint8_t* p, I c0, I c1, I c2, I c3) {
        // packus works within 128-bit lanes: afterwards dword (lane j, slot q) holds
        // c_q[4j..4j+3]; the permute puts them back in element order.
        const I bytes = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
        const I order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_storeu_si512(p, _mm512_permutexvar_epi32(order, bytes));
    }
};

constexpr ConvertKernels table = make_convert_kernels<Kernels<Avx512>>();

}  // namespace

const ConvertKernels* convert_kernels_avx512() { return &table; }

}  // namespace fp8kit::cpu
