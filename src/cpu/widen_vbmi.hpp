// src/cpu/widen_vbmi.hpp: FP8 codes to bf16 in AVX-512 registers, 64 at a time (VBMI byte tables),
// for the kernels built with AVX-512 VBMI flags: src/cpu/gemm_avx512.cpp (its small-M kernel and
// the tile windows) and src/cpu/gemm_amx.cpp (its streaming kernel). Include it only from such a
// file: it is compiled with that file's ISA flags (internal linkage, so no definition is shared
// between files built with different flags). Checked by tests/ops/test_gemm.cpp
// (EveryCodeOfBDecodesExactly on every kernel that widens).
#pragma once

#include <immintrin.h>

#include "cpu/gemm_kernels.hpp"

namespace fp8kit::cpu {
namespace {

// ---- widening: 64 codes per step, two 128-entry byte lookups (VPERMI2B) ----
// The low and high bytes of each bf16 are looked up separately, by the code's low 7 bits (VPERMI2B
// reads no more of an index): an FP8 value's sign is the code's top bit and the bf16's, and the
// low byte does not depend on it, so the high byte takes the code's sign bit by a bitwise or.
// The exception is code 0x80 of the fnuz formats, NaN and not -0: where a code may be one, it is
// set to the table's NaN after the lookup. The bytes are interleaved with VPUNPCK[LH]BW, which
// works within 128-bit lanes; the codes are first permuted so that the interleaved words come out
// in order. (Four lookups of the whole 256-entry tables and two blends took 4-10% longer at
// M = 4..24 in cache, bench on Zen 5.)
struct Widen {
    __m512i perm, lo[2], hi[2];
    __m512i nan_lo, nan_hi;  // the table's bf16 bytes for code 0x80
    bool neg_zero_is_nan;    // code 0x80 is NaN (e4m3fnuz, e5m2fnuz)
    explicit Widen(const ExpandTable& t)
        : nan_lo(_mm512_set1_epi8(char(t.lo[0x80]))), nan_hi(_mm512_set1_epi8(char(t.hi[0x80]))),
          neg_zero_is_nan(!format_info(t.format).has_neg_zero) {
        alignas(64) static const uint8_t order[64] = {
            0,  1,  2,  3,  4,  5,  6,  7,  32, 33, 34, 35, 36, 37, 38, 39, 8,  9,  10, 11, 12, 13,
            14, 15, 40, 41, 42, 43, 44, 45, 46, 47, 16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51,
            52, 53, 54, 55, 24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63};
        perm = _mm512_load_si512(order);
        for (int i = 0; i < 2; ++i) {
            lo[i] = _mm512_load_si512(t.lo + 64 * i);
            hi[i] = _mm512_load_si512(t.hi + 64 * i);
        }
    }
    // bf16 of codes[0..32) into w0, of codes[32..64) into w1. may_have_nan80: whether a code
    // may be an fnuz format's NaN 0x80 (false skips the fix-up).
    void operator()(const uint8_t* codes, __m512i& w0, __m512i& w1, bool may_have_nan80) const {
        const __m512i x = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(codes));
        __m512i l = _mm512_permutex2var_epi8(lo[0], x, lo[1]);
        // hi[x & 0x7f] | (x & 0x80): VPTERNLOG's truth table 0xF8 is a | (b & c).
        __m512i h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi[0], x, hi[1]), x,
                                              _mm512_set1_epi8(char(0x80)), 0xF8);
        if (may_have_nan80) {
            const __mmask64 nan = _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(char(0x80)));
            l = _mm512_mask_mov_epi8(l, nan, nan_lo);
            h = _mm512_mask_mov_epi8(h, nan, nan_hi);
        }
        w0 = _mm512_unpacklo_epi8(l, h);
        w1 = _mm512_unpackhi_epi8(l, h);
    }
};

}  // namespace
}  // namespace fp8kit::cpu
