// src/cpu/gemm_avx2.cpp: the GEMM kernels on AVX2 + FMA - every x86-64 CPU since 2013 (Haswell,
// Zen) and AVX-512 CPUs without AMX. Built with -mavx2 -mfma; chosen at run time on the avx2 and
// avx512 paths when AMX cannot run. Checked against the reference backend and float64 by
// tests/ops/test_gemm.cpp (the avx2 and avx512 ISA paths).
//
// Why the same numbers as the tiles: every FP8 value is exact in bf16 and in float32, and a
// product of two of them is exact in float32, so fma(a, b, acc) = acc + a*b rounded once - the
// float32 addition of an exact product that TDPBF16PS and the portable kernel perform. The tile
// kernel adds each element's products in K order, as they do.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/gemm_kernels.hpp"
#include "cpu/matmul_kernel.hpp"

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
    // earlier (the byte before a strip's first row is allocated: gemm_code_lead), not by a shift:
    // shifts share pipes with the FMAs on Zen 3, and this one cost 3-7% of a pass (one core).
    template <bool Nonfinite, bool Offset>
    static void decode_element(const uint8_t* row, int e, const ExpandTable& t, __m256 w[2]) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row - 1 + e));
        const __m256i f = field(x);
        const __m256i tops[2] = {_mm256_slli_epi32(f, 16), _mm256_and_si256(f, _mm256_set1_epi32(int(0xffff0000u)))};
        for (int j = 0; j < 2; ++j) w[j] = Offset ? _mm256_castsi256_ps(tops[j]) : value(tops[j]);
        if constexpr (Nonfinite) {
            const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
            fix<2>(codes, row, t, w, [e](int i) { return std::pair{i % 4 == e ? 0 : i % 4 == 2 + e ? 1 : -1, i / 4}; });
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

// 16 columns in PairRow's order (even columns, odd columns) back in column order: unpack
// interleaves within 128-bit halves (columns 0-3 | 8-11 and 4-7 | 12-15), permute2f128 joins
// the halves.
void column_order(__m256 even, __m256 odd, __m256& c0_7, __m256& c8_15) {
    const __m256 a = _mm256_unpacklo_ps(even, odd), b = _mm256_unpackhi_ps(even, odd);
    c0_7 = _mm256_permute2f128_ps(a, b, 0x20);
    c8_15 = _mm256_permute2f128_ps(a, b, 0x31);
}

// ---- tiles: B windows widened to float32 rows, A rows widened once per block ----
// The window of a strip holds, per K chunk, 32 rows of 16 float32 (B[16 s + c, 32 chunk + k] at
// element 16 k + c), so a K step of the kernel is two loads of B and one broadcast per
// row of A, and the FMAs take no integer work. Twice the bytes of a bf16 window, so the window
// spans half the K (run_tiles); widening each element into two registers in the loop instead ran
// the kernel at 0.8 of the FMA peak, this at 0.94 (one thread, in L1/L2).

// 32 codes of one K pair row of a packed strip into two window rows of 16 float32: element 0 of
// the pair, then element 1. Nonfinite: the strip holds a NaN or Inf code (the fix-up's check).
template <Format F, bool Nonfinite>
void widen_format(const uint8_t* codes, int64_t n, const ExpandTable& t, float* out) {
    for (int64_t i = 0; i < n; i += 2 * gemm_tile) {
        __m256 w[4];
        PairRow<F>::template decode_columns<Nonfinite>(codes + i, t, w);
        for (int j = 0; j < 4; ++j) _mm256_store_ps(out + i + 8 * j, w[j]);
    }
}

template <Format F>
void widen_format(const uint8_t* codes, int64_t n, const ExpandTable& t, bool nonfinite, float* out) {
    if (nonfinite) return widen_format<F, true>(codes, n, t, out);
    widen_format<F, false>(codes, n, t, out);
}

void widen_b_avx2(const uint8_t* codes, int64_t n, const ExpandTable& t, bool nan, void* out) {
    const DenormalsRead read;
    float* f = static_cast<float*>(out);
    switch (t.format) {
        case Format::e4m3fn: return widen_format<Format::e4m3fn>(codes, n, t, nan, f);
        case Format::e5m2: return widen_format<Format::e5m2>(codes, n, t, nan, f);
        case Format::e4m3fnuz: return widen_format<Format::e4m3fnuz>(codes, n, t, nan, f);
        default: return widen_format<Format::e5m2fnuz>(codes, n, t, nan, f);
    }
}

// Rows [0, R) x one 16-column strip over `kn` of K: 2R accumulators, each element's products
// added in K order (fma: the exact product added, one rounding - the tiles' sum). A is float32
// (row stride ldaf), so its broadcasts are loads. R = 6: 12 accumulators, the two B vectors and
// one broadcast fill the 16 ymm registers, and 12 independent chains cover the FMA latency
// (4 cycles x 2 pipes) with room; R = 5 (10 chains) takes the rest of a whole block's rows, where
// R = 4 (8 chains, none to spare) ran 17% slower a flop than R = 6 (perf, 4096^3); fewer rows only
// where M leaves no more (micro_rows). GCC keeps the accumulator array in registers only when the
// row loops are unrolled (else it stores them every step: 35 instead of 96 GFLOP/s), hence
// FP8KIT_UNROLL.
template <int R>
void micro(const float* af, int64_t ldaf, const float* b, int64_t kn, float* c, int64_t ldc, bool accumulate) {
    __m256 acc[R][2];
    FP8KIT_UNROLL(8)
    for (int r = 0; r < R; ++r) {
        acc[r][0] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
        acc[r][1] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
    }
    FP8KIT_UNROLL(4)
    for (int64_t k = 0; k < kn; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * gemm_tile), b1 = _mm256_loadu_ps(b + k * gemm_tile + 8);
        FP8KIT_UNROLL(8)
        for (int r = 0; r < R; ++r) {
            const __m256 a = _mm256_broadcast_ss(af + r * ldaf + k);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    FP8KIT_UNROLL(8)
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(c + r * ldc, acc[r][0]);
        _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
    }
}

// The block's A rows (up to 48, chunks x 32 bf16) widened to float32, per thread (48 x 128
// floats, 24 KiB, unless a K group is longer than the 128-K window). run_tiles calls block for
// every pair of strips with the same rows of A, so the widened rows are kept until a block asks
// for others; begin() (the start of a task) forgets them, since packed A lives only for one
// GEMM. Widening per call took 11% of a 2048^3 GEMM.
struct WidenedA {
    const uint16_t* a = nullptr;
    int64_t lda = 0, rows = 0, kn = 0;
    std::vector<float> f;

    const float* get(const uint16_t* a_, int64_t lda_, int64_t rows_, int64_t kn_) {
        if (a_ == a && lda_ == lda && rows_ == rows && kn_ == kn) return f.data();
        a = a_, lda = lda_, rows = rows_, kn = kn_;
        if (f.size() < size_t(rows_ * kn_)) f.resize(size_t(rows_ * kn_));
        float* out = f.data();  // locals: the vector stores may alias the members
        for (int64_t r = 0; r < rows_; ++r) {
            const uint16_t* in = a_ + r * lda_;
            for (int64_t k = 0; k < kn_; k += 8) {
                // The next rows of A (read once this block's strips and groups are done) into L2.
                if (k % 32 == 0) _mm_prefetch(reinterpret_cast<const char*>(in + rows_ * lda_ + k), _MM_HINT_T1);
                const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k));
                const __m256i widened = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);  // bf16 -> float32
                _mm256_storeu_ps(out + r * kn_ + k, _mm256_castsi256_ps(widened));
            }
        }
        return out;
    }
};
thread_local WidenedA widened_a;

void begin_avx2() { widened_a.a = nullptr; }

// Rows [0, rows) of af (ldaf apart) times a strip's K slice of b into c, in ceil(rows / 6) micro
// calls of sizes as even as rows allows: 48 = 8 x 6, 32 = 6 + 6 + 5 x 4, 16 = 6 + 5 + 5, and a last
// tile's rows only (10 = 5 + 5, 9 = 5 + 4) rather than all 16.
using Micro = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool);
constexpr Micro micros[7] = {nullptr, &micro<1>, &micro<2>, &micro<3>, &micro<4>, &micro<5>, &micro<6>};
void micro_rows(int64_t rows, const float* af, int64_t ldaf, const float* b, int64_t kn, float* c, int64_t ldc,
                bool accumulate) {
    const int64_t calls = (rows + 5) / 6, base = rows / calls, bigger = rows % calls;
    for (int64_t i = 0, r = 0; i < calls; ++i) {
        const int64_t size = base + (i < bigger);
        micros[size](af + r * ldaf, ldaf, b, kn, c + r * ldc, ldc, accumulate);
        r += size;
    }
}

// K is swept in slices of at most 256 (the window is 128 of K: GemmKernels::window_chunks): a
// strip's slice of B stays in L1 while every row group passes over it; the accumulators go
// through c between slices, which keeps each element's sum in K order. Only the rows asked for
// are computed: M = 10 on one 16-row tile took as long as 16 (55-69 GFLOP/s on Zen 3).
void block_avx2(int rows, int nj, const uint16_t* a, int64_t lda, const void* bw, int64_t b_strip, int64_t chunks,
                float* c, int64_t ldc, bool accumulate) {
    constexpr int64_t slice = 8 * gemm_chunk;
    const auto* b = static_cast<const float*>(bw);
    const int64_t kn = chunks * gemm_chunk;
    const float* af = widened_a.get(a, lda, rows, kn);
    // The block's sums so far (a line per row and strip) are asked for at once: each window
    // passes over the task's whole accumulator (4 MiB at 4096 rows), which has left L2 by the
    // next, and each micro call would wait for its lines in turn (4096^3: 0.90 -> 0.95x OpenBLAS,
    // medians alternating in one process).
    if (accumulate) {
        for (int64_t r = 0; r < rows; ++r) {
            for (int j = 0; j < nj; ++j) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + j * gemm_tile), _MM_HINT_T0);
        }
    }
    for (int64_t k0 = 0; k0 < kn; k0 += slice) {
        const int64_t len = std::min(slice, kn - k0);
        const bool add = accumulate || k0 > 0;
        for (int j = 0; j < nj; ++j) {
            const float* bj = b + j * b_strip + k0 * gemm_tile;
            float* cj = c + j * gemm_tile;
            micro_rows(rows, af + k0, kn, bj, len, cj, ldc, add);
        }
    }
}

// ---- small M: B's codes widened in registers, streamed once ----
// Strip s of B times R rows of A (af, float32) into out[r * ldacc + col]. Offset: af holds A times
// 2^(127 - bias - c) and B is decoded without its multiply (PairRow), so each group's sums are the
// exact ones times 2^-c, and undo = 2^c takes them back (small_format says why that is exact).
template <Format F, int R, bool Nonfinite, bool Offset>
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
                    PairRow<F>::template decode_element<Nonfinite, Offset>(chunk + p * 2 * gemm_tile, e, t, w);
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
        const __m256 sb0 = _mm256_loadu_ps(b.scales.data() + g * b.strips * gemm_tile + s * gemm_tile);
        const __m256 sb1 = _mm256_loadu_ps(b.scales.data() + g * b.strips * gemm_tile + s * gemm_tile + 8);
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

// Strip s times R rows (the decode's fix-up only where the strip holds a NaN or Inf code).
template <Format F, int R, bool Offset>
void small_rows(const float* af, int64_t ldaf, const PackedB& b, int64_t s, const float* sa, float undo,
                const ExpandTable& t, float* out, int64_t ldacc) {
    if (b.strip_nonfinite[size_t(s)]) {
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

// Codes to bf16 bits, 32 at a time: read as a pair row (codes 2c and 2c + 1 as column c's pair),
// decoded to float32 (exact in bf16, so the low half is zero) in column order, and each pair's
// two high halves joined into one 32-bit word: out[2c], out[2c + 1].
template <Format F>
void expand_format(const uint8_t* codes, int64_t n, const ExpandTable& t, uint16_t* out) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 w[4];
        PairRow<F>::template decode_columns<true>(codes + i, t, w);
        for (int h = 0; h < 2; ++h) {  // columns 0-7, 8-15
            const __m256i even = _mm256_srli_epi32(_mm256_castps_si256(w[h]), 16);
            const __m256i pair = _mm256_blend_epi16(even, _mm256_castps_si256(w[2 + h]), 0xaa);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16 * h), pair);
        }
    }
    for (; i < n; ++i) out[i] = t.bf16[codes[i]];
}

void expand_avx2(const uint8_t* codes, int64_t n, const ExpandTable& t, uint16_t* out) {
    const DenormalsRead read;
    switch (t.format) {
        case Format::e4m3fn: return expand_format<Format::e4m3fn>(codes, n, t, out);
        case Format::e5m2: return expand_format<Format::e5m2>(codes, n, t, out);
        case Format::e4m3fnuz: return expand_format<Format::e4m3fnuz>(codes, n, t, out);
        default: return expand_format<Format::e5m2fnuz>(codes, n, t, out);
    }
}

// Where the small-M kernel stops paying: it decodes each strip once a pass of up to 6 rows, while
// the tiles decode B once into a widened copy and compute the rows there are. On 2 Zen 3 cores
// (4096 x 4096, the best of alternating runs) the tiles ran ahead at M = 32 (136 GFLOP/s against
// the small kernel's 116; 48: 144 against 139) and behind it up to 24 (M = 24: 136 against 148).
constexpr GemmKernels avx2_kernels{&expand_avx2, &widen_b_avx2, 4, 16, 4, 3, 0, &block_then_promote<&block_avx2>, &begin_avx2,
                                    &no_tile_state, &small_avx2, 24, &matmul_f32_avx2, &scale_store_loop, nullptr, nullptr, 0, &pack_group_loop, "avx2"};
static_assert(avx2_kernels.block_tiles <= max_block_tiles, "block_then_promote's part holds max_block_tiles row tiles");

}  // namespace

const GemmKernels* avx2_gemm_kernels() { return &avx2_kernels; }

// The layer ops' float32 matmul on the tile kernel (micro above): B packed into 16-column panels
// of K-order rows (zero-padded at the right edge), A as float32 rows (a transposed copy when it
// is stored [k, m]). A task is 48 rows x 8 panels (128 columns): K is swept in slices of 256, a
// panel's slice (16 KiB) stays in L1 while the task's row groups pass over it and the rows' slice
// (48 KiB) stays in L2 across the panels. Each element is one float32 sum in k order, one
// rounding per fma, then c added once when accumulating: the sum matmul_kernel computes with
// contracted multiply-adds, within the same bound (tests/ops/test_matmul.cpp). Tasks split M and
// N, never K, so the result does not depend on the thread count.
void matmul_f32_avx2(float* c, const float* a, bool ta, const float* b, bool tb, int64_t m, int64_t n, int64_t k,
                     bool accumulate) {
    constexpr int64_t task_rows = 48, task_panels = 8, slice = 256, ldacc = task_panels * gemm_tile;
    if (m <= 0 || n <= 0) return;
    std::vector<float> a_packed;
    a = matmul_rows_of_a(a, ta, m, k, a_packed);
    const std::vector<float> bp = matmul_panels_of_b(b, tb, n, k);
    static_assert(matmul_tile_cols == gemm_tile, "a panel of B is one strip of the tile kernel");
    const int64_t panels = (n + gemm_tile - 1) / gemm_tile;
    const int64_t row_tasks = (m + task_rows - 1) / task_rows, col_tasks = (panels + task_panels - 1) / task_panels;
#pragma omp parallel for schedule(static) if (m * n * k > 32 * parallel_min_work)
    for (int64_t task = 0; task < row_tasks * col_tasks; ++task) {
        const int64_t i0 = task / col_tasks * task_rows, rows = std::min(task_rows, m - i0);
        const int64_t p0 = task % col_tasks * task_panels, np = std::min(task_panels, panels - p0);
        float acc[task_rows * ldacc] = {};  // stays zero where k == 0
        for (int64_t k0 = 0; k0 < k; k0 += slice) {
            const int64_t len = std::min(slice, k - k0);
            for (int64_t p = 0; p < np; ++p) {
                const float* panel = bp.data() + (p0 + p) * k * gemm_tile + k0 * gemm_tile;
                micro_rows(rows, a + i0 * k + k0, k, panel, len, acc + p * gemm_tile, ldacc, k0 > 0);
            }
        }
        const int64_t cols = std::min(np * gemm_tile, n - p0 * gemm_tile);
        for (int64_t r = 0; r < rows; ++r) {
            float* crow = c + (i0 + r) * n + p0 * gemm_tile;
            const float* v = acc + r * ldacc;
            for (int64_t j = 0; j < cols; ++j) crow[j] = accumulate ? crow[j] + v[j] : v[j];
        }
    }
}

}  // namespace fp8kit::cpu
