// src/cpu/widen_vbmi.hpp: FP8 codes to bf16 in AVX-512 registers, 64 at a time (VBMI byte tables),
// and power-of-two scales folded into them, for the kernels built with AVX-512 VBMI flags:
// src/cpu/gemm_avx512.cpp (its small-M kernel and the tile windows) and src/cpu/gemm_amx.cpp (its
// streaming kernel). Include it only from such a file: it is compiled with that file's ISA flags
// (internal linkage, so no definition is shared between files built with different flags).
// Checked by tests/ops/test_gemm.cpp (EveryCodeOfBDecodesExactly on every kernel that widens; the
// folding by the grid's mx32 and block_pow2 cases against float64, and
// AQTensorBForOneCallEqualsItsPackedWeight).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

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
        init_arith(t.format);
    }
    // bf16 of codes[0..32) into w0, of codes[32..64) into w1. may_have_nan80: whether a code
    // may be an fnuz format's NaN 0x80 (false skips the fix-up).
    void operator()(const uint8_t* codes, __m512i& w0, __m512i& w1, bool may_have_nan80) const {
        (*this)(_mm512_loadu_si512(codes), w0, w1, may_have_nan80);
    }
    // The same of 64 codes in a register.
    void operator()(__m512i codes, __m512i& w0, __m512i& w1, bool may_have_nan80) const {
        const __m512i x = _mm512_permutexvar_epi8(perm, codes);
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

    // ---- the arithmetic widening: 64 normal codes by shifts, B times 2^-unit_log2 ----
    // A nonzero finite normal code's exponent and mantissa bits, shifted right into a bf16's
    // (VPSRAW: the sign lands in bit 15), with exponent bits ORed in - a bias with no bit where
    // the code's exponent lands, so the OR is an add - make a bf16 whose value is the code's
    // times a power of two: e4m3 + 112 (the exponent's 4 bits under bits 4-6 of bf16's): 2^-8
    // e4m3fn, 2^-7 e4m3fnuz; e5m2 + 128 (5 bits under bit 7): 2^16 e5m2, 2^17 e5m2fnuz. The
    // kernel multiplies A by 2^arith_unit_log2 (exact; a bf16 A of 2^-102 or more times 2^-17 is still
    // normal, and the caller checks the other way for overflow), so each product, and every sum,
    // is the table widening's. Zero, subnormal, Inf and NaN codes do not fit (no hidden bit, or
    // no finite value): their lines take the tables (PackedB::chunk_specials). VPSRAW works on
    // the code in a word's high byte: the line's bytes are first permuted so that word 2c holds
    // column c's even-K codes of the line's two pairs and word 2c + 1 its odd-K codes; w1 (the
    // second pair) shifts the high bytes, w0 moves the low bytes up first (VPSLLW 8). One VPERMB
    // on the shuffle port, against the tables' five (VPERMB, two VPERMI2B, two VPUNPCK): 5.5
    // cycles per 64 codes with the two VDPBF16PS in L1 on Sapphire Rapids, against 8.2. In the
    // M = 1 kernel (gemm_avx512.cpp) from L2, one core: 18.8-19.0 -> 22.7-24.3 GB/s of codes; 2
    // threads on 1536 x 1536 just read (L2 and L3) 3-10% faster; out of cache within 1-3%, where
    // the memory stream, not the widening, bounds it.
    // Only with a table of unit_log2 = arith_unit_log2(format) (expand_table(f, true)), whose
    // lookups give the same scaled values for the lines of other codes.
    void arith(const uint8_t* codes, __m512i& w0, __m512i& w1) const {
        const __m512i x = _mm512_permutexvar_epi8(arith_perm, _mm512_loadu_si512(codes));
        __m512i pair0, pair1;  // the low bytes' codes (the line's first pair), the high bytes'
        if (e4m3) {
            pair0 = _mm512_srai_epi16(_mm512_slli_epi16(x, 8), 4);
            pair1 = _mm512_srai_epi16(x, 4);
        } else {
            pair0 = _mm512_srai_epi16(_mm512_slli_epi16(x, 8), 3);
            pair1 = _mm512_srai_epi16(x, 3);
        }
        // (a & mask) | bias: VPTERNLOG's truth table 0xEA
        w0 = _mm512_ternarylogic_epi32(pair0, arith_mask, arith_bias, 0xEA);
        w1 = _mm512_ternarylogic_epi32(pair1, arith_mask, arith_bias, 0xEA);
    }

    // The arithmetic widening with a fold (gemm.cpp, "Folding"): B times 2^e, e per column as
    // fold_add gives it (e << 7 in each lane, b_fold_add's). The exponent bits are added, not ORed:
    // bias + (e + unit_log2) << 7, the unit's 2^-unit_log2 undone, so A is not scaled; a folding e
    // keeps the sum inside bf16's exponent field (gemm_kernels.hpp, fold_max_log2). arith_fold_add
    // makes that addend once per strip and group.
    __m512i arith_fold_add(__m512i fold_add) const {
        return _mm512_add_epi16(fold_add, _mm512_add_epi16(arith_bias, _mm512_set1_epi16(short(arith_unit << 7))));
    }
    void arith_fold(const uint8_t* codes, __m512i add, __m512i& w0, __m512i& w1) const {
        const __m512i x = _mm512_permutexvar_epi8(arith_perm, _mm512_loadu_si512(codes));
        const int right = e4m3 ? 4 : 3;
        w0 = _mm512_add_epi16(_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(x, 8), right), arith_mask), add);
        w1 = _mm512_add_epi16(_mm512_and_si512(_mm512_srai_epi16(x, right), arith_mask), add);
    }

private:
    bool e4m3 = true;
    int arith_unit = 0;
    __m512i arith_perm, arith_mask, arith_bias;
    void init_arith(Format f) {
        e4m3 = f == Format::e4m3fn || f == Format::e4m3fnuz;
        arith_unit = arith_unit_log2(f);
        // sign, then e4m3's 4 exponent + 3 mantissa bits (e5m2's 5 + 2) in bits 10-4 (11-5)
        arith_mask = _mm512_set1_epi16(short(e4m3 ? 0x87f0 : 0x8fe0));
        arith_bias = _mm512_set1_epi16(short(e4m3 ? 112 << 7 : 128 << 7));
        arith_perm = _mm512_load_si512(arith_order.data());
    }
    // Line byte 32 p + 2 c + e (pair p, column c, K parity e) to byte 4 c + 2 e + p; a constant,
    // as Widen is made for every window the tiles widen.
    alignas(64) static constexpr std::array<uint8_t, 64> arith_order = [] {
        std::array<uint8_t, 64> order{};
        for (int c = 0; c < 16; ++c) {
            for (int e = 0; e < 2; ++e) {
                for (int p = 0; p < 2; ++p) order[size_t(4 * c + 2 * e + p)] = uint8_t(32 * p + 2 * c + e);
            }
        }
        return order;
    }();
};

// ---- folding (gemm.cpp, "Folding") on 32 bf16 lanes ----

// w + add where a lane is nonzero and finite: magnitude - 1 below 0x7f7f (0 wraps to 0xffff).
inline __m512i fold_lanes(__m512i w, __m512i add) {
    const __m512i mag = _mm512_and_si512(w, _mm512_set1_epi16(0x7fff));
    const __mmask32 finite_nonzero = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(mag, _mm512_set1_epi16(1)),
                                                             _mm512_set1_epi16(0x7f7f));
    return _mm512_mask_add_epi16(w, finite_nonzero, w, add);
}

// b_fold_add in vectors, from the strip's 16 column scales in the group (folding powers of two, or 0
// past n: addend 0): each dword lane c is column c's exponent in a bf16's exponent field, twice.
inline __m512i fold_add_lanes(const float* sb) {
    const __m512i bits = _mm512_loadu_si512(sb);
    const __m512i e = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(127)), 7);
    const __m512i lo = _mm512_and_si512(e, _mm512_set1_epi32(0xffff));
    return _mm512_maskz_or_epi32(_mm512_test_epi32_mask(bits, bits), lo, _mm512_slli_epi32(lo, 16));
}

// One 64-code line of B widened and folded: by shifts with the fold in the exponent add where the
// line is all normals (PackedB::chunk_specials' bit clear), else by the tables and fold_lanes.
inline void widen_fold_line(const Widen& widen, const uint8_t* codes, bool special, bool nan, __m512i add,
                            __m512i arith_add, __m512i& w0, __m512i& w1) {
    if (!special) return widen.arith_fold(codes, arith_add, w0, w1);
    widen(codes, w0, w1, nan);
    w0 = fold_lanes(w0, add);
    w1 = fold_lanes(w1, add);
}

// Lines of a packed strip made from B's 16 rows (ld apart, ld <= INT32_MAX / 16): one gather
// takes the next 4 elements (two K pairs) of each row as a dword, and a word permute puts the
// first pair of every row before the second - the strip's 64-byte line for those 4 elements.
alignas(64) constexpr std::array<uint16_t, 32> pairs_apart = [] {
    std::array<uint16_t, 32> order{};
    for (int c = 0; c < 16; ++c) order[size_t(c)] = uint16_t(2 * c), order[size_t(16 + c)] = uint16_t(2 * c + 1);
    return order;
}();
struct StripLines {
    __m512i order, rows;
    explicit StripLines(int64_t ld)
        : order(_mm512_load_si512(pairs_apart.data())),
          rows(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                  _mm512_set1_epi32(int(ld)))) {}
    __m512i line(const uint8_t* at) const { return _mm512_permutexvar_epi16(order, _mm512_i32gather_epi32(rows, at, 1)); }
};

// Chunk K elements [e, e + 32) of a strip of B's rows (row0, ld apart, `cols` of them; k
// elements a row): true where its lines come by StripLines gathers (a whole strip, no padding);
// else false, the chunk packed into `chunk` (zeroed first: padding codes are +0).
inline bool chunk_gathers(const uint8_t* row0, int64_t ld, int64_t cols, int64_t e, int64_t k, uint8_t* chunk) {
    if (cols == gemm_tile && ld <= INT32_MAX / gemm_tile && e + gemm_chunk <= k) return true;
    std::memset(chunk, 0, gemm_chunk_codes);
    pack_group_loop(row0 + e, ld, cols, std::clamp<int64_t>(k - e, 0, gemm_chunk), chunk);
    return false;
}

// 16 x 16 dwords transposed in registers: r[i] dword j -> r[j] dword i (unpacks within 128-bit
// lanes, after which r[4k + c]'s lane q holds dword 4q + c of rows 4k .. 4k + 3; then the lanes
// gathered by two rounds of 128-bit shuffles).
inline void transpose_dwords(__m512i r[16]) {
    __m512i t[16];
    for (int k = 0; k < 8; ++k) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) {
        r[4 * k + 0] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        r[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        r[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        r[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512i lo01 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), hi01 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
        const __m512i lo23 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88), hi23 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(lo01, lo23, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(lo01, lo23, 0xdd);
        t[12 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0xdd);
    }
    for (int j = 0; j < 16; ++j) r[j] = t[j];
}

// The next 16 lines of a whole strip (16 rows of B, ld apart, from `at`): the rows' next 64 codes
// loaded and transposed as dwords, dword j of every row (K elements 4j .. 4j + 3) being line j,
// its pairs put apart as StripLines::line puts them. With a gather a line (StripLines) instead,
// a GEMM on a QTensor B (2 threads, Zen 5) ran 128 x 4096 x 4096 at 655-656 GFLOP/s against
// 838-869 (B packed ahead: 894), 512 x 1024 x 1024 at 860-862 against 908.
inline void strip_lines16(const uint8_t* at, int64_t ld, const StripLines& lines, __m512i r[16]) {
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(at + i * ld);
    transpose_dwords(r);
    for (int j = 0; j < 16; ++j) r[j] = _mm512_permutexvar_epi16(lines.order, r[j]);
}

// GemmKernels::widen_rows with a Widen the caller holds: `chunks` chunks of a strip of B's rows
// from K element e0, each line of the packed strip made in a register, then widened - and folded
// where `fold` holds each chunk's 32 addends (b_fold_add's, [chunks][32]; null: not folded): a
// whole strip two chunks at a time (strip_lines16), else a chunk at a time, its lines by
// StripLines gathers or read from the chunk packed with its padding.
inline void widen_rows(const Widen& widen, const uint8_t* row0, int64_t ld, int64_t cols, int64_t e0, int64_t chunks,
                       int64_t k, uint16_t* out, const int16_t* fold = nullptr) {
    const StripLines lines(ld);
    // Line l of chunk q (l < 8), widened from its codes v, to out (q's tile), folded with q's addends.
    const auto store = [&](__m512i v, int64_t q, int64_t l, uint16_t* tile) {
        __m512i w0, w1;
        widen(v, w0, w1, widen.neg_zero_is_nan);
        if (fold != nullptr) {
            const __m512i add = _mm512_loadu_si512(fold + q * 2 * gemm_tile);
            w0 = fold_lanes(w0, add);
            w1 = fold_lanes(w1, add);
        }
        _mm512_storeu_si512(tile + 64 * l, w0);
        _mm512_storeu_si512(tile + 64 * l + 32, w1);
    };
    int64_t q = 0;
    if (cols == gemm_tile) {
        for (; q + 2 <= chunks && e0 + (q + 2) * gemm_chunk <= k; q += 2, out += 2 * gemm_chunk_codes) {
            __m512i r[16];
            strip_lines16(row0 + e0 + q * gemm_chunk, ld, lines, r);
            for (int l = 0; l < 16; ++l) store(r[l], q + l / 8, l % 8, out + l / 8 * gemm_chunk_codes);
        }
    }
    for (; q < chunks; ++q, out += gemm_chunk_codes) {
        alignas(64) uint8_t chunk[gemm_chunk_codes];
        const bool gathers = chunk_gathers(row0, ld, cols, e0 + q * gemm_chunk, k, chunk);
        for (int64_t l = 0; l < gemm_chunk_codes / 64; ++l) {
            store(gathers ? lines.line(row0 + e0 + q * gemm_chunk + 4 * l) : _mm512_load_si512(chunk + 64 * l), q, l, out);
        }
    }
}

}  // namespace
}  // namespace fp8kit::cpu
