// src/cpu/pair_row_avx2.hpp: FP8 codes to float32 in AVX2 registers, 32 at a time (PairRow), and
// the MXCSR guard of every entry that decodes (DenormalsRead), for the AVX2 GEMM kernels:
// src/cpu/gemm_avx2.cpp (the tiles' windows, expand) and src/cpu/gemm_avx2_small.cpp (the small-M
// kernel). Include it only from a file built with the AVX2 flags: internal linkage, so no
// definition is shared between files built with different flags. Checked by
// tests/ops/test_gemm.cpp (EveryCodeOfBDecodesExactly, NanCodePoisonsOnlyItsRowOrColumn, on the
// avx2 path).
#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <utility>

#include "cpu/gemm_kernels.hpp"

namespace fp8kit::cpu {
namespace {

// ---- FP8 codes to float32 in registers, 32 at a time, for every GEMM format ----
// A 32-byte row of a packed chunk holds one K pair p for the strip's 16 columns (byte 32 p + 2 c
// + e). Read as eight 32-bit words, word d holds columns 2d and 2d + 1, elements 0 and 1 of the
// pair, so each byte position of the words is one (column parity, element) class of 8 lanes:
// w[0] even columns' element 0, w[1] even columns' element 1, w[2] odd columns' element 0, w[3]
// odd columns' element 1. The tiles store them as window rows; the small-M kernel takes one
// element at a time (w[0] and w[2], then w[1] and w[3]), times A's K value broadcast.
//
// The decode is shifts and one multiply (no F16C): a code's byte, at the top of a 16-bit word
// (moved there, or loaded there) and shifted right arithmetically, has its exponent and mantissa
// bits on bf16's and its sign copied up to bit 15; the mask keeps those. That bf16, moved to a
// float32's top half, is the value times 2^(bias - 127) - subnormal codes too, as float32
// subnormals with the same mantissa - so one exact multiply by 2^(127 - bias) gives the value
// (every FP8 value is a float32, and so is every product of two), or the small-M kernel leaves
// it to A's rows (small_format). Codes that are not numbers (NaN; e5m2's Inf) come out finite: a
// strip with one (PackedB::strip_nonfinite; every row for expand_format) checks each row and takes
// those codes from the table.
template <Format F>
struct PairRow {
    static constexpr bool five = F == Format::e5m2 || F == Format::e5m2fnuz;
    static constexpr int shift = five ? 3 : 4;  // the byte's exponent field onto bf16's
    static constexpr int bias = F == Format::e4m3fn ? 7 : F == Format::e4m3fnuz ? 8 : F == Format::e5m2 ? 15 : 16;

    // Element e of each pair in pair order, for the small-M kernel: w[0] the even columns, w[1]
    // the odd ones (bytes 4d + e and 4d + 2 + e). One element at a time leaves the kernel two
    // registers of B, so a pass of 6 rows keeps its 12 accumulators in registers. Offset: B's values
    // times 2^(bias - 127), without the multiply (A carries the rest: small_format).
    // Element 1's codes are the words' high bytes; element 0's become them in a load one byte
    // earlier rather than by a shift: shifts share pipes with the FMAs on Zen 3, and this one cost
    // 3-7% of a pass (one core). Checked reads the row as it stands, shifts, and takes its NaN and
    // Inf codes from the table: for strips that hold one, and for the first strip of B, whose first
    // row has no byte before it.
    template <bool Checked, bool Offset>
    static void decode_element(const uint8_t* row, int e, const ExpandTable& t, __m256 w[2]) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Checked ? row : row - 1 + e));
        const __m256i f = Checked && e == 0 ? field(_mm256_slli_epi16(x, 8)) : field(x);
        const __m256i tops[2] = {_mm256_slli_epi32(f, 16), _mm256_and_si256(f, _mm256_set1_epi32(int(0xffff0000u)))};
        for (int j = 0; j < 2; ++j) w[j] = Offset ? _mm256_castsi256_ps(tops[j]) : value(tops[j]);
        if constexpr (Checked) {
            fix<2>(x, row, t, w, [e](int i) { return std::pair{i % 4 == e ? 0 : i % 4 == 2 + e ? 1 : -1, i / 4}; });
        }
    }

    // In column order, for the tiles' window: w[0], w[1] element 0 of columns 0-7, 8-15; w[2],
    // w[3] element 1. The 16-bit words (column c's pair) are unpacked to 32 bits within 128-bit
    // halves, so the 64-bit permute first puts columns 0-3 and 8-11 in the low half.
    template <bool Nonfinite>
    static void decode_columns(const uint8_t* row, const ExpandTable& t, __m256 w[4]) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
        const __m256i y = _mm256_permute4x64_epi64(x, 0xd8);
        const __m256i lo = field(_mm256_slli_epi16(y, 8)), hi = field(y);
        const __m256i zero = _mm256_setzero_si256();
        w[0] = value(_mm256_unpacklo_epi16(zero, lo));
        w[1] = value(_mm256_unpackhi_epi16(zero, lo));
        w[2] = value(_mm256_unpacklo_epi16(zero, hi));
        w[3] = value(_mm256_unpackhi_epi16(zero, hi));
        if constexpr (Nonfinite) fix<4>(x, row, t, w, [](int i) { return std::pair{(i % 2) * 2 + i / 16, (i / 2) % 8}; });  // byte 2c + e
    }

  private:
    // The bf16 field of each 16-bit word's high byte.
    static __m256i field(__m256i x) {
        return _mm256_and_si256(_mm256_srai_epi16(x, shift), _mm256_set1_epi16(int16_t(0x8000 | (0x7f << (8 - shift)))));
    }
    static __m256 value(__m256i top_half) {
        return _mm256_mul_ps(_mm256_castsi256_ps(top_half), _mm256_set1_ps(std::bit_cast<float>(uint32_t(254 - bias) << 23)));
    }
    // The NaN and Inf codes of the row from the table; place(i): byte i's vector of the N and
    // lane (vector -1: a byte these vectors do not hold). The compares are finite_code's
    // (gemm_kernels.hpp), on the row's 32 bytes at once.
    template <int N, class Place>
    static void fix(__m256i x, const uint8_t* row, const ExpandTable& t, __m256 w[N], Place place) {
        const __m256i em = _mm256_and_si256(x, _mm256_set1_epi8(0x7f));
        __m256i bad;
        if constexpr (F == Format::e4m3fn) {
            bad = _mm256_cmpeq_epi8(em, _mm256_set1_epi8(0x7f));
        } else if constexpr (F == Format::e5m2) {
            bad = _mm256_cmpgt_epi8(em, _mm256_set1_epi8(0x7b));
        } else {
            bad = _mm256_cmpeq_epi8(x, _mm256_set1_epi8(char(0x80)));
        }
        const uint32_t at = uint32_t(_mm256_movemask_epi8(bad));  // bit i: byte i
        if (at == 0) return;
        alignas(32) float v[N][8];
        for (int j = 0; j < N; ++j) _mm256_store_ps(v[j], w[j]);
        for (int i = 0; i < 32; ++i) {
            if ((at >> i & 1u) == 0) continue;
            const auto [j, lane] = place(i);
            if (j >= 0) v[j][lane] = std::bit_cast<float>(uint32_t(t.bf16[row[i]]) << 16);  // NaN or Inf, whatever t's unit
        }
        for (int j = 0; j < N; ++j) w[j] = _mm256_load_ps(v[j]);
    }
};

// The decode's float32 subnormals (B's subnormal codes before the multiply, or as the small-M
// kernel's offset keeps them) are inputs to arithmetic, which MXCSR's denormals-are-zero would
// read as zero - and torch.set_flush_denormal(True) sets it on the caller's thread. Each entry that
// decodes clears it while it runs and restores the caller's MXCSR. (Flush-to-zero acts on results,
// and none of the kernels' results is subnormal: NUMERICS.md, small_format.)
class DenormalsRead {
  public:
    DenormalsRead() : csr_(_mm_getcsr()) {
        if (csr_ & daz) _mm_setcsr(csr_ & ~daz);
    }
    ~DenormalsRead() {
        if (csr_ & daz) _mm_setcsr(csr_);
    }
    DenormalsRead(const DenormalsRead&) = delete;
    DenormalsRead& operator=(const DenormalsRead&) = delete;

  private:
    static constexpr unsigned daz = 0x40;  // MXCSR.DAZ
    unsigned csr_;
};

}  // namespace
}  // namespace fp8kit::cpu
