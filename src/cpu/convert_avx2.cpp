// src/cpu/convert_avx2.cpp: the conversion kernels on AVX2 (+FMA, F16C), 8 lanes.
// Compiled with -mavx2 -mfma -mf16c; only reached after cpuid says so.
// Checked against the scalar functions over all 2^32 float32 inputs (test_convert_exhaustive).
#include <immintrin.h>

#include "cpu/convert_simd.hpp"

namespace fp8kit::cpu {
namespace {

struct Avx2 {
    static constexpr size_t W = 8;
    using I = __m256i;
    using F = __m256;
    using Mask = __m256i;  // all-ones lanes

    static I set1(uint32_t v) { return _mm256_set1_epi32(int(v)); }
    static F set1f(float v) { return _mm256_set1_ps(v); }
    static I as_i(F v) { return _mm256_castps_si256(v); }
    static F as_f(I v) { return _mm256_castsi256_ps(v); }
    static I add(I a, I b) { return _mm256_add_epi32(a, b); }
    static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
    static I and_(I a, I b) { return _mm256_and_si256(a, b); }
    static I or_(I a, I b) { return _mm256_or_si256(a, b); }
    template <int K> static I srli(I a) { return _mm256_srli_epi32(a, K); }
    template <int K> static I slli(I a) { return _mm256_slli_epi32(a, K); }
    static I min_u(I a, I b) { return _mm256_min_epu32(a, b); }
    static I max_u(I a, I b) { return _mm256_max_epu32(a, b); }
    static uint32_t hmax(I a) {
        __m128i m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
        m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
        return uint32_t(_mm_cvtsi128_si32(m));
    }
    // Lane g = hmax(r[g]): the 8 registers' maxima as one, halving the lanes that each holds a
    // partial max of (8 registers of 8, 4 of 2 x 4, 2 of 4 x 2, 1 of 8 x 1).
    static I hmax_lanes(const I* r) {
        I s[4], t[2];
        for (int i = 0; i < 4; ++i) {  // s[i]: 128-bit half h = r[2i + h]'s partial
            s[i] = max_u(_mm256_permute2x128_si256(r[2 * i], r[2 * i + 1], 0x20), _mm256_permute2x128_si256(r[2 * i], r[2 * i + 1], 0x31));
        }
        for (int j = 0; j < 2; ++j) {  // t[j]: half h = [r[4j + h] x 2, r[4j + 2 + h] x 2]
            t[j] = max_u(_mm256_unpacklo_epi64(s[2 * j], s[2 * j + 1]), _mm256_unpackhi_epi64(s[2 * j], s[2 * j + 1]));
        }
        // half h = [r[h], r[2 + h], r[4 + h], r[6 + h]], then in order
        const F a = as_f(t[0]), b = as_f(t[1]);
        const I m = max_u(as_i(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), as_i(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
        return _mm256_permutevar8x32_epi32(m, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F cvt_f(I a) { return _mm256_cvtepi32_ps(a); }
    static I round_i(F a) {
        // Explicit round-to-nearest-even, then an exact truncating conversion: no MXCSR.
        return _mm256_cvttps_epi32(_mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // Signed compares: every value compared is below 2^31 or deliberately signed.
    static Mask lt(I a, I b) { return _mm256_cmpgt_epi32(b, a); }
    static Mask gt(I a, I b) { return _mm256_cmpgt_epi32(a, b); }
    static Mask eq(I a, I b) { return _mm256_cmpeq_epi32(a, b); }
    static Mask mask_or(Mask a, Mask b) { return _mm256_or_si256(a, b); }
    static I select(Mask m, I a, I b) { return _mm256_blendv_epi8(b, a, m); }

    static F load(const float* p) { return _mm256_loadu_ps(p); }
    static F load(const bf16* p) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return as_f(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static F load(const f16* p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
    static I load_i(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
    static void store_i(uint32_t* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
    static I load_u8(const uint8_t* p) {
        return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    }

    static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
    // 8 lanes of values 0..0xffff to 16-bit, in order (packus interleaves the 128-bit lanes).
    static __m128i pack_u16(I v) {
        return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
    }
    // 16-bit outputs: two registers (16 values) per 32-byte store.
    static void store(bf16* p, F a, F b) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                            _mm256_set_m128i(pack_u16(bf16_bits<Avx2>(b)), pack_u16(bf16_bits<Avx2>(a))));
    }
    static void store(f16* p, F a, F b) {
        constexpr int rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_set_m128i(_mm256_cvtps_ph(b, rn), _mm256_cvtps_ph(a, rn)));
    }
    // One register of codes (each lane 0..255) to 8 bytes.
    static void store_u8(uint8_t* p, I c) {
        const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
    }
    // One 64-byte line from an aligned buffer to an aligned destination, non-temporal.
    static void stream_line(uint8_t* dst, const uint8_t* src) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), _mm256_load_si256(reinterpret_cast<const __m256i*>(src)));
        _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 32)));
    }
    static void fence() { _mm_sfence(); }
    // Four registers of codes (each lane 0..255) to 32 bytes in order.
    static void store_u8x4(uint8_t* p, I c0, I c1, I c2, I c3) {
        // After the packs, dword (lane j, slot q) holds c_q[4j..4j+3]; permute to element order.
        const I bytes = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
        const I order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permutevar8x32_epi32(bytes, order));
    }
};

constexpr ConvertKernels table = make_convert_kernels<Kernels<Avx2>>();

}  // namespace

const ConvertKernels* convert_kernels_avx2() { return &table; }

}  // namespace fp8kit::cpu
