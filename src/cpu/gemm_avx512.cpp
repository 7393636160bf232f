// src/cpu/gemm_avx512.cpp: the GEMM kernels on AVX-512 with BF16 (VDPBF16PS) and VBMI, for the
// x86-64 CPUs that have them but no AMX tiles: AMD Zen 4 and Zen 5, Intel Cooper Lake (no VBMI
// there: it takes the AVX2 kernels). Also the byte-table widening and the small-M kernel that
// the AMX kernels (src/cpu/gemm_amx.cpp) share - on AMX CPUs a single row, with most lines
// widened by shifts instead (widen_vbmi.hpp). Built with -mavx512{f,bw,vl,vbmi,bf16}; chosen at
// run time on the avx512 path when cpuid reports AVX512-BF16 and AVX512-VBMI and AMX cannot run.
// Checked against the reference backend and float64 by tests/ops/test_gemm.cpp (the avx512 ISA
// path on such a CPU).
//
// Why the numbers are the tiles': every FP8 value is exact in bf16, and the product of two is
// exact in float32 (at most 4 x 4 significant bits), so VDPBF16PS adds exact products of a K
// pair to a float32 lane - the sum TDPBF16PS forms - at twice the products per instruction of a
// float32 FMA. It flushes subnormal inputs and results to zero: no FP8 value is subnormal as a
// bf16, no product of two is subnormal in float32 (the smallest, 2^-17 * 2^-17 of e5m2fnuz, is
// 2^-34), and a float32 sum of them is a multiple of that smallest product, so never subnormal.
#include <immintrin.h>

#include <cpuid.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/gemm_kernels.hpp"
#include "cpu/widen_vbmi.hpp"

namespace fp8kit::cpu {

void expand_vbmi(const uint8_t* codes, int64_t n, const ExpandTable& t, uint16_t* out) {
    const Widen widen(t);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i w0, w1;
        widen(codes + i, w0, w1, widen.neg_zero_is_nan);
        _mm512_storeu_si512(out + i, w0);
        _mm512_storeu_si512(out + i + 32, w1);
    }
    for (; i < n; ++i) out[i] = t.bf16[codes[i]];
}

namespace {

// ---- small M: AVX512-BF16 dot products of bf16 pairs on codes widened in registers ----
// A 64-code line of a packed strip holds two K pairs p, p + 1 for the strip's 16 columns (byte
// 32 p + 2 c + e); widened, each is 16 lanes of (B[c, 2p], B[c, 2p + 1]), and VDPBF16PS adds
// A[r, 2p] B[c, 2p] + A[r, 2p + 1] B[c, 2p + 1] to lane c with the A pair broadcast. One
// accumulator per row and strip takes the pairs in K order - the tiles' sum, so D does not
// depend on which of the two kernels M chose - in blocks of R rows x S strips: R x S <= 16
// accumulators beside the widening's 8 tables and constants and its 2 outputs in the 32
// registers, and enough independent chains for VDPBF16PS (latency ~6 cycles, two a cycle on
// Zen 5): two pairs a line make a chain 12 cycles per 64 codes, so below 9 rows two strips pass
// at once. A line of each of the S strips is widened first, then each row's two A pairs are
// broadcast once for all S strips: with each strip's rows in turn, GCC kept all of a line's
// broadcasts live across the strips and spilled accumulators to the stack (M = 8, two strips, x
// 4096 x 4096 on 2 threads, Zen 5: 651-655 -> 812-868 GFLOP/s out of cache, 699 -> 975 in
// cache; M = 1-6 alike). A single row (M = 1) streams one strip (two on AMX CPUs: small_strips_for) and sums its
// pairs in four accumulators a strip, by pair index mod 4 (two lines' pairs in flight), added
// (0 + 1) + (2 + 3) at the group's end: with two (even and odd pairs) a chain took one VDPBF16PS a
// line, and its latency held a core at ~52 GB/s of codes from L2 (82 with four, 84 with eight; 2
// threads from L3: 90 -> 155 GB/s; Zen 5); two strips at once streamed the codes 4-8% slower out of
// cache. VDPBF16PS flushes subnormal products to zero; a product of two FP8 values as bf16 is never
// subnormal in float32 (the smallest, 2^-17 * 2^-17 of e5m2fnuz, is 2^-34).
// Rows: B left as its rows (PackedB::rows, a single row: small_bf16), each line of a strip made
// in a register from its 16 rows (StripLines) - a chunk with padding (a strip of fewer than 16
// rows, K's end) packed into a zeroed chunk first - and widened by the tables. The gather bounds
// it, and still beats packing B in the call first: a QTensor B at M = 1, 2 threads, rotating
// copies out of cache, the median call's GB/s of codes (2026-12-02, Sapphire Rapids): 4096 x
// 4096 11.7 -> 17.2 (B packed ahead: 29.4), 11008 x 4096 10.6 -> 17.3, 1536 x 1536 7.7 -> 10.8.
template <OneRowStream P, int R, int S, bool Rows>
void small_block(const uint16_t* a, const PackedB& b, int64_t s, const float* sa, const Widen& widen, bool arith,
                 float* acc, int64_t ldacc) {
    const KLayout& kl = b.kl;
    const int64_t cpg = kl.chunks_per_group();
    const uint8_t* codes[S];  // the packed strips; Rows: the strips' first rows
    int64_t cols[S];          // Rows: the strips' rows of B
    bool nan80[S];
    for (int j = 0; j < S; ++j) {
        cols[j] = std::min(gemm_tile, b.n - (s + j) * gemm_tile);
        codes[j] = Rows ? b.rows + (s + j) * gemm_tile * b.ld : b.strip(s + j);
        nan80[j] = widen.neg_zero_is_nan && b.strip_nonfinite[size_t(s + j)] != 0;
    }
    const StripLines lines(b.ld);
    bool gathers[S] = {};  // Rows: the chunk's lines by gathers (chunk_gathers), else from padded
    alignas(64) uint8_t padded[S][gemm_chunk_codes];
    constexpr int lanes = R == 1 ? 4 : 1;  // accumulators per row and strip: pair p goes to p % lanes
    // M = 1: strip j's chunk `ahead` chunks past q in this thread's stream - past the strip's
    // end, of the next block's strip j (the caller's next block: strips s + S on, in memory
    // right after these), where the stream goes next; null past B.
    const int64_t total_chunks = kl.padded / gemm_chunk;
    const auto stream_chunk = [&](int j, int64_t q, int64_t ahead) -> const char* {
        int64_t at = q + ahead;
        const uint8_t* strip = codes[j];
        if (at >= total_chunks) {
            at -= total_chunks;
            strip = at < total_chunks && s + S + j < b.strips ? b.strip(s + S + j) : nullptr;
        }
        return strip == nullptr ? nullptr : reinterpret_cast<const char*>(strip + at * gemm_chunk_codes);
    };
    for (int64_t g = 0; g < kl.groups; ++g) {
        // This group's scales of the next block of strips, a strip's whole sweep of K ahead: a miss
        // at a group's end stalls the stream, and a strip's scale lines (PackedB::sb), one per group
        // among its codes' 32 and more, are too few for the hardware prefetchers to follow (block
        // scaling at 1 x 4096 x 4096 out of cache without it: 85-89 GFLOP/s against 95-100). Four groups
        // ahead (8 KiB of codes) was too close under a loaded memory's latency: block scaling
        // out of cache, M = 1 streamed 10-13% faster with the strip ahead, M = 4 4%, M = 16 2%
        // (settings alternated in one process, Zen 5); with none, M = 16 from Python ran 625-653
        // GFLOP/s against 662-691. Caution: the 16-row block's registers are few - with its 16 A
        // rows apart (before small_pack_avx512), which row addresses the compiler spilled moved
        // the same shape between 447 and 690 with changes elsewhere in this function (the same prefetch through
        // a helper in gemm_kernels.hpp: 448-570); check a change here by its speed at M = 16,
        // block scaling included.
        for (int j = 0; j < S && kl.groups > 1 && s + S + j < b.strips; ++j) {
            _mm_prefetch(reinterpret_cast<const char*>(b.sb(s + S + j, g)), _MM_HINT_T0);
        }
        __m512 sum[R][S][lanes];
        for (int r = 0; r < R; ++r) {
            for (int j = 0; j < S; ++j) {
                for (int e = 0; e < lanes; ++e) sum[r][j][e] = _mm512_setzero_ps();
            }
        }
        for (int64_t q = g * cpg; q < (g + 1) * cpg; ++q) {
            // Every line of each strip's chunk some chunks ahead: M > 1 8 into L1; M = 1 as P says.
            // Zen 5 (P = avx512_one_row): M = 1 out of cache streamed its codes at 0.82-0.84 of
            // the read peak with none, 0.89-0.90 with 8 ahead (at 54 GB/s); since it sums in four
            // lanes, 16 ahead streams 8-10% faster than 8 at 60-75 GB/s (32: alike; an L2
            // prefetch 48-96 chunks ahead besides: 10% slower), while two strips 16 ahead each
            // (M = 2-8) streamed 2% slower than 8 (gemm() on rotating weight copies, the settings
            // alternated in one process). Sapphire Rapids (amx_one_row, two strips): 4 ahead into
            // L1, past the strips' end into the next block's, against 16 (which spilled into the
            // next strip in memory, for one of the two the wrong one): gemm() from f32 x on 708 MB
            // of 1536 x 1536 copies 19.5-20.4 -> 23.4 GB/s, 403 MB of 4096 x 4096 copies
            // 22.6-23.4 -> 25.6-25.7 (2 threads, the two builds alternated; NTA halved the
            // stream). A further PREFETCHT1 32 chunks ahead into L2, kept from then to 2026-12-02,
            // cost more than it gave: without it e4m3 weights in turn out of cache (the best call
            // of 1.5-2 s, the settings alternated in one process) 1 x 4096 x 4096 605-634 -> 511-516
            // us, 11008 x 4096 1669-1671 -> 1292-1347, 4096 x 11008 1647-1678 -> 1299-1309, 1536 x
            // 1536 57 -> 53-54, 32000 x 1536 1809-1816 -> 1563-1568; 2, 6 and 8 into L1 no better
            // than 4, none 4% slower. The software prefetches each hold one of the core's 16 L1
            // fill buffers until their line arrives, while the L2 streamer follows the strips by
            // itself. (M > 1 keeps its addresses as they were: see the caution above.)
            for (int j = 0; j < S; ++j) {
                if constexpr (Rows) {  // no prefetch: the hardware prefetchers follow B's rows
                    gathers[j] = chunk_gathers(codes[j], b.ld, cols[j], q * gemm_chunk, kl.k, padded[j]);
                } else if constexpr (R > 1) {
                    for (int line = 0; line < gemm_chunk_codes / 64; ++line) {
                        _mm_prefetch(reinterpret_cast<const char*>(codes[j] + (q + 8) * gemm_chunk_codes + line * 64), _MM_HINT_T0);
                    }
                } else {
                    // a chunk's lines are contiguous: its address once, then 64 bytes a line
                    if (const char* p = stream_chunk(j, q, P.l1_ahead)) {
                        for (int line = 0; line < gemm_chunk_codes / 64; ++line) _mm_prefetch(p + 64 * line, _MM_HINT_T0);
                    }
                }
            }
            // Lines of normal codes widen by shifts where P and A allow (A then times 2^unit_log2).
            uint8_t specials[S];
            for (int j = 0; j < S; ++j) specials[j] = P.arith && arith ? b.specials(s + j, q) : 0xff;
            const auto line_pairs = [&](int l) {
                const uint16_t* ap = a + 2 * R * (q * gemm_chunk / 2 + 2 * l);  // K pairs 2l, 2l + 1 of the chunk
                const int e0 = (2 * l) % lanes, e1 = (2 * l + 1) % lanes;
                __m512i w0[S], w1[S];
                for (int j = 0; j < S; ++j) {
                    if constexpr (Rows) {
                        widen(gathers[j] ? lines.line(codes[j] + q * gemm_chunk + 4 * l) : _mm512_load_si512(padded[j] + 64 * l),
                              w0[j], w1[j], nan80[j]);
                    } else {
                        const uint8_t* line = codes[j] + q * gemm_chunk_codes + 64 * l;
                        if (P.arith && (specials[j] >> l & 1) == 0) {
                            widen.arith(line, w0[j], w1[j]);
                        } else {
                            widen(line, w0[j], w1[j], nan80[j]);
                        }
                    }
                }
                for (int r = 0; r < R; ++r) {
                    int32_t p0, p1;
                    std::memcpy(&p0, ap + 2 * r, 4);
                    std::memcpy(&p1, ap + 2 * R + 2 * r, 4);
                    const __m512bh a0 = std::bit_cast<__m512bh>(_mm512_set1_epi32(p0));
                    const __m512bh a1 = std::bit_cast<__m512bh>(_mm512_set1_epi32(p1));
                    for (int j = 0; j < S; ++j) {
                        sum[r][j][e0] = _mm512_dpbf16_ps(sum[r][j][e0], a0, std::bit_cast<__m512bh>(w0[j]));
                        sum[r][j][e1] = _mm512_dpbf16_ps(sum[r][j][e1], a1, std::bit_cast<__m512bh>(w1[j]));
                    }
                }
            };
            // A single row's four accumulators are indexed by the line (pair index mod 4): they
            // stay in registers only with the loop unrolled (else each VDPBF16PS loads and stores
            // its accumulator). With the prefetch addresses once a chunk, M = 1 from L2 (512 x
            // 1024, one Sapphire Rapids core) 16.2-17.7 -> 18.8-19.0 GB/s of codes. More rows
            // keep the loop as it was (see the caution above on the 16-row block's registers).
            if constexpr (R == 1) {
                FP8KIT_UNROLL(8)
                for (int l = 0; l < gemm_chunk_codes / 64; ++l) line_pairs(l);
            } else {
                for (int l = 0; l < gemm_chunk_codes / 64; ++l) line_pairs(l);
            }
        }
        // One group: the raw sums (scaled in the epilogue). Groups: promoted into acc as each ends,
        // the rows in turn by one pointer. (Each row's own address and both branches inside the
        // unrolled rows made GCC spill sums and addresses to the stack: a tenth of the kernel's
        // samples with block scaling; without, 1 x 128 A by 128 x 128 B at M = 8-128 x 4096 x 4096
        // ran 6-8% faster and tensor scaling as fast as before, Zen 5.)
        __m512 part[R][S];
        for (int r = 0; r < R; ++r) {
            for (int j = 0; j < S; ++j) {
                part[r][j] = lanes == 4 ? _mm512_add_ps(_mm512_add_ps(sum[r][j][0], sum[r][j][1]), _mm512_add_ps(sum[r][j][2], sum[r][j][3]))
                                        : sum[r][j][0];
            }
        }
        if (kl.groups == 1) {
            for (int r = 0; r < R; ++r) {
                for (int j = 0; j < S; ++j) _mm512_storeu_ps(acc + r * ldacc + j * gemm_tile, part[r][j]);
            }
            continue;
        }
        for (int j = 0; j < S; ++j) {
            const __m512 sb = _mm512_loadu_ps(b.sb(s + j, g));
            float* out = acc + j * gemm_tile;
            const float* sar = sa + g;
            const int64_t groups = kl.groups;
            if (g == 0) {
                for (int r = 0; r < R; ++r, out += ldacc, sar += groups) {
                    _mm512_storeu_ps(out, _mm512_mul_ps(part[r][j], _mm512_mul_ps(_mm512_set1_ps(*sar), sb)));
                }
            } else {
                for (int r = 0; r < R; ++r, out += ldacc, sar += groups) {
                    _mm512_storeu_ps(out, _mm512_fmadd_ps(part[r][j], _mm512_mul_ps(_mm512_set1_ps(*sar), sb), _mm512_loadu_ps(out)));
                }
            }
        }
    }
}

// Strips [s, s1) for R rows: blocks of S strips, then of S / 2, ... for the rest.
template <OneRowStream P, int R, int S, bool Rows = false>
void small_strips(const uint16_t* a, const PackedB& b, int64_t s, int64_t s1, const float* sa, const Widen& widen,
                  bool arith, float* acc, int64_t ldacc) {
    for (; s + S <= s1; s += S, acc += S * gemm_tile) small_block<P, R, S, Rows>(a, b, s, sa, widen, arith, acc, ldacc);
    if constexpr (S > 1) small_strips<P, R, S / 2, Rows>(a, b, s, s1, sa, widen, arith, acc, ldacc);
}

// Strips per block for R rows (see small_block); a single row streams P.strips at once. One
// on Zen 5 (two streamed its codes 4-8% slower out of cache); two on Sapphire Rapids, whose core
// pulls more from memory with two streams than with one: M = 1 out of cache, gemm() on rotating
// 1 GiB of weight copies, 2 threads, 4096 x 4096 and 11008 x 4096: 21.1-21.7 GB/s of codes with
// one strip, 24.6-25.4 with two, 24.5-25.5 with four (2026-11-25).
template <OneRowStream P>
constexpr int small_strips_for(int rows) { return rows == 1 ? P.strips : rows > 8 ? 1 : 2; }

using SmallRows = void (*)(const uint16_t*, const PackedB&, int64_t, int64_t, const float*, const Widen&, bool, float*,
                           int64_t);
template <OneRowStream P, std::size_t... R>
constexpr std::array<SmallRows, sizeof...(R)> small_rows_table(std::index_sequence<R...>) {
    return {&small_strips<P, int(R) + 1, small_strips_for<P>(int(R) + 1)>...};
}
constexpr int small_rows_max = 16;
template <OneRowStream P>
constexpr auto small_rows = small_rows_table<P>(std::make_index_sequence<small_rows_max>());

// A's rows [rows][k] (row stride lda) times 2^unit into out [rows][k], for the arithmetic
// widening; false (out unfinished) where a finite nonzero value would leave bf16's normals -
// a weight-only A of 2^120 or more against e4m3fn - and the tables must widen instead. Zero, Inf
// and NaN stay as they are; an A has no subnormal (NUMERICS.md: the weight-only flush).
bool scale_rows(const uint16_t* a, int64_t rows, int64_t lda, int64_t k, int unit, uint16_t* out) {
    const __m512i add = _mm512_set1_epi16(short(unit * 128));  // unit in the exponent field
    const __m512i ones = _mm512_set1_epi16(0xff);  // the exponent field's mask, and Inf's / NaN's field
    const __m512i lowest = _mm512_set1_epi16(short(1 - unit)), highest = _mm512_set1_epi16(short(0xfe - unit));
    __mmask32 outside = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* row = a + r * lda;
        uint16_t* o = out + r * k;
        for (int64_t i = 0; i < k; i += 32) {  // k: a multiple of 32 (KLayout::padded)
            const __m512i v = _mm512_loadu_si512(row + i);
            const __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, 7), ones);
            const __mmask32 scale = _mm512_cmpneq_epi16_mask(e, _mm512_setzero_si512()) & _mm512_cmpneq_epi16_mask(e, ones);
            outside |= scale & (_mm512_cmplt_epi16_mask(e, lowest) | _mm512_cmpgt_epi16_mask(e, highest));
            _mm512_storeu_si512(o + i, _mm512_mask_add_epi16(v, scale, v, add));
        }
    }
    return outside == 0;
}

// The small kernel's rows in even groups of up to 16 (17 rows: 9 and 8, never a single row, which
// sums apart): the rows of each but the last.
int64_t small_group_rows(int64_t rows) {
    const int64_t groups = (rows + small_rows_max - 1) / small_rows_max;
    return (rows + groups - 1) / groups;
}

// Rows [0, n) of A (row stride lda, k elements: a multiple of 32) with their K pairs interleaved,
// the small kernel's layout: pair p of row r at out + 2 (p n + r), so that every broadcast of a
// line is one address plus a constant. Row by row, the 16-row block kept its 16 row addresses in
// general registers, spilled and reloaded in the loop. 16 pairs of the n rows at a time,
// transposed as dwords (a gather a pair took 4-6% of an M = 1-4 call at 4096 x 4096).
void interleave_pairs(const uint16_t* a, int n, int64_t lda, int64_t k, uint16_t* out) {
    const auto live = __mmask16((1u << n) - 1);
    for (int64_t p = 0; p < k / 2; p += 16) {
        __m512i r[16];
        for (int i = 0; i < 16; ++i) r[i] = i < n ? _mm512_loadu_si512(a + i * lda + 2 * p) : _mm512_setzero_si512();
        transpose_dwords(r);
        for (int j = 0; j < 16; ++j) _mm512_mask_storeu_epi32(out + 2 * (p + j) * n, live, r[j]);
    }
}

// GemmKernels::small_pack: each group of rows (small_group_rows) interleaved by K pair, at its
// first row's offset r k.
void small_pack_avx512(int64_t rows, const uint16_t* a, int64_t lda, int64_t k, uint16_t* out) {
    const int64_t per = small_group_rows(rows);
    for (int64_t r = 0; r < rows; r += per) interleave_pairs(a + r * lda, int(std::min(per, rows - r)), lda, k, out + r * k);
}

}  // namespace

// A's rows as small_pack_avx512 left them (a single row, which the AMX sets pass as it is, is its
// own interleaving).
template <OneRowStream P>
void small_bf16(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
                const float* sa, const ExpandTable& t, bool /*fold: never asked (each set that runs this folds only past its M)*/, float* acc,
                int64_t ldacc) {
    // B left as its rows: gemm() gives them a single row here (GemmKernels::small_rows_max_m; the
    // AMX sets take more rows on the tiles), its lines widened by the tables.
    if (b.rows != nullptr) {
        return small_strips<P, 1, small_strips_for<P>(1), true>(a, b, s0, s1, sa, Widen(t), false, acc, ldacc);
    }
    // With the arithmetic widening, A times 2^arith_unit_log2 and the tables' values (for lines
    // of other codes) divided by it, so that every product is the same.
    bool arith = false;
    if constexpr (P.arith) {
        thread_local std::vector<uint16_t> scaled;  // per thread and call
        scaled.resize(size_t(rows * b.kl.padded));
        arith = scale_rows(a, rows, lda, b.kl.padded, arith_unit_log2(b.format), scaled.data());
        if (arith) {
            a = scaled.data();
            lda = b.kl.padded;
        }
    }
    const Widen widen(arith ? expand_table(b.format, true) : t);
    // Rows in their groups (small_pack_avx512). With one group all strips pass in turn; with more,
    // 2 strips at a time, so that the groups after the first read them from L2 (2 x 16 x K bytes).
    const int64_t per = small_group_rows(rows);
    const int64_t step = per == rows ? s1 - s0 : 2;
    for (int64_t s = s0; s < s1; s += step) {
        const int64_t e = std::min(s1, s + step);
        for (int64_t r = 0; r < rows; r += per) {
            small_rows<P>[size_t(std::min(per, rows - r) - 1)](a + r * lda, b, s, e, sa + r * b.kl.groups, widen, arith,
                                                                          acc + r * ldacc + (s - s0) * gemm_tile, ldacc);
        }
    }
}

// GemmKernels::pack_group for whole strips: 16 lines of dst at a time from 64 codes of each row
// (strip_lines16), then a line a StripLines gather, where the loop made 32 two-byte copies. A
// partial strip, and the last pair or element, go through pack_group_loop.
void pack_group_avx512(const uint8_t* row0, int64_t ld, int64_t cols, int64_t len, uint8_t* dst) {
    if (cols < gemm_tile || ld > INT32_MAX / gemm_tile) return pack_group_loop(row0, ld, cols, len, dst);
    const StripLines lines(ld);
    int64_t e = 0;
    for (; e + 64 <= len; e += 64, dst += 64 * gemm_tile) {
        __m512i r[16];
        strip_lines16(row0 + e, ld, lines, r);
        for (int l = 0; l < 16; ++l) _mm512_storeu_si512(dst + 64 * l, r[l]);
    }
    for (; e + 3 < len; e += 4, dst += 4 * gemm_tile) _mm512_storeu_si512(dst, lines.line(row0 + e));
    pack_group_loop(row0 + e, ld, cols, len - e, dst);
}

// GemmKernels::fold: fold_loop's adds on 32 bf16 lanes.
void fold_vbmi(uint16_t* x, int64_t n, const int16_t* add) {
    const __m512i a = _mm512_loadu_si512(add);
    for (int64_t i = 0; i < n; i += 2 * gemm_tile) _mm512_storeu_si512(x + i, fold_lanes(_mm512_loadu_si512(x + i), a));
}

// GemmKernels::widen_fold: widen_fold_line over the lines.
void widen_fold_vbmi(const uint8_t* codes, int64_t n, const ExpandTable& t, bool nan, const int16_t* add,
                     const uint8_t* specials, uint16_t* out) {
    const Widen widen(t);
    const __m512i a = _mm512_loadu_si512(add), arith = widen.arith_fold_add(a);
    for (int64_t line = 0; line < n / 64; ++line) {
        __m512i w0, w1;
        widen_fold_line(widen, codes + 64 * line, (specials[line / 8] >> (line % 8)) & 1, nan && widen.neg_zero_is_nan,
                        a, arith, w0, w1);
        _mm512_storeu_si512(out + 64 * line, w0);
        _mm512_storeu_si512(out + 64 * line + 32, w1);
    }
}

// GemmKernels::widen_rows on VBMI (widen_vbmi.hpp's widen_rows, with the tables of t).
void widen_rows_vbmi(const uint8_t* row0, int64_t ld, int64_t cols, int64_t e0, int64_t chunks, int64_t k,
                     const ExpandTable& t, const int16_t* fold, void* out) {
    widen_rows(Widen(t), row0, ld, cols, e0, chunks, k, static_cast<uint16_t*>(out), fold);
}

// GemmKernels::mark_strip on AVX-512BW: mark_strip_loop's tests as byte compares, a line at a
// time. A 512 x 2048 x 2048 GEMM whose B was packed into a PackedWeight in the call (as a QTensor
// B was until gemm() took one for its call), 2 threads: 2.03-2.05 ms with the two loops in
// gemm.cpp's baseline build (B's rows for the NaN / Inf flag, then the packed strip: 3x the
// packing itself), the same with mark_strip_loop built here, 1.94 with this (1.64 with B packed
// ahead).
bool mark_strip_avx512(const uint8_t* strip, int64_t lines, Format f, uint8_t* specials) {
    const __m512i mag_bits = _mm512_set1_epi8(0x7f), top = _mm512_set1_epi8(char(code_top(f)));
    const __m512i lo = _mm512_set1_epi8(char(1 << format_info(f).mantissa_bits));
    const bool fnuz = code_top(f) == 0x80u;  // their one NaN, 0x80, has magnitude 0; no Inf
    __mmask64 nonfinite = 0;
    for (int64_t line = 0; line < lines; ++line) {
        const __m512i v = _mm512_loadu_si512(strip + 64 * line), mag = _mm512_and_si512(v, mag_bits);
        const __mmask64 high = _mm512_cmpge_epu8_mask(mag, top);  // e4m3fn's NaN, e5m2's Inf and NaN
        nonfinite |= fnuz ? _mm512_cmpeq_epi8_mask(v, top) : high;
        const bool special = (_mm512_cmplt_epu8_mask(mag, lo) | high) != 0;
        specials[line / 8] |= uint8_t(uint32_t(special) << (line % 8));
    }
    return nonfinite != 0;
}

// GemmKernels::scale_store on AVX512-BF16: the same float32 values as scale_store_loop (each
// multiply and the bias add rounded on its own; GELU by scale_values' loop, which this TU
// vectorizes), and a bf16 D by VCVTNE2PS2BF16 - round to nearest even and NaN made quiet, as
// fp8kit::bf16 - where no value is a float32 subnormal, which the instruction flushes to zero: 32
// values with one are rounded by bf16_round_bits.
void scale_store_avx512(float* v, float alpha, float sa, const float* sb, const float* bias, bool gelu, void* out,
                        bool bf16_out, int64_t cols) {
    if (!bf16_out) return scale_store_loop(v, alpha, sa, sb, bias, gelu, out, false, cols);
    if (gelu) scale_values(v, alpha, sa, sb, bias, true, cols);  // v holds D's float32 values then
    auto* o = static_cast<uint16_t*>(out);
    const __m512 va = _mm512_set1_ps(alpha), vs = _mm512_set1_ps(sa);
    const auto d = [&](int64_t j) {
        if (gelu) return _mm512_loadu_ps(v + j);
        const __m512 x = _mm512_mul_ps(va, _mm512_mul_ps(_mm512_loadu_ps(v + j), _mm512_mul_ps(vs, _mm512_loadu_ps(sb + j))));
        return bias != nullptr ? _mm512_add_ps(x, _mm512_loadu_ps(bias + j)) : x;
    };
    const auto subnormal = [](__m512 x) {  // exponent bits 0, mantissa bits not
        const __m512i b = _mm512_castps_si512(x);
        return _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(b, _mm512_set1_epi32(0x7f800000)), b,
                                           _mm512_set1_epi32(0x007fffff));
    };
    int64_t j = 0;
    for (; j + 32 <= cols; j += 32) {
        const __m512 d0 = d(j), d1 = d(j + 16);
        if ((subnormal(d0) | subnormal(d1)) != 0) {
            alignas(64) float x[32];
            _mm512_store_ps(x, d0);
            _mm512_store_ps(x + 16, d1);
            for (int e = 0; e < 32; ++e) o[j + e] = bf16_round_bits(x[e]);
            continue;
        }
        const __m512bh h = _mm512_cvtne2ps_pbh(d1, d0);  // d0 in the low half
        std::memcpy(o + j, &h, sizeof h);
    }
    if (gelu) {
        for (; j < cols; ++j) o[j] = bf16_round_bits(v[j]);
    } else {
        scale_store_loop(v + j, alpha, sa, sb + j, bias == nullptr ? nullptr : bias + j, false, o + j, true, cols - j);
    }
}

template void small_bf16<avx512_one_row>(int64_t, const uint16_t*, int64_t, const PackedB&, int64_t, int64_t,
                                         const float*, const ExpandTable&, bool, float*, int64_t);
template void small_bf16<amx_one_row>(int64_t, const uint16_t*, int64_t, const PackedB&, int64_t, int64_t,
                                      const float*, const ExpandTable&, bool, float*, int64_t);

namespace {

// The small-M kernel takes M <= 32 here (the AMX kernels keep it to M = 1: their streaming tile
// kernel is faster from 2 rows). Measured on Zen 5 (2 threads, x 4096 x 4096, in cache): 662 / 700 / 845 GFLOP/s at
// M = 4 / 8 / 16 against the tiles' 180 / 354 / 704; 822 / 857-871 at M = 24 / 32 (tiles 581 /
// 799); at M = 40 814 against 738, at 48 860 against 884, at 64 860 against 915 (M = 33..40
// would gain by it, rare shapes). Out of cache at M = 16 790-810 against the tiles' 501-506: the
// codes streamed once instead of widened into a window that 16 rows share.
// With A interleaved (small_pack_avx512) it also passes the tiles on a large B packed ahead, up
// to M = 256 (each 16 rows then widen B's lines again, where the tiles widen a window once for
// all rows). GFLOP/s, tiles / small kernel, 2 threads, weights rotating out of cache, Zen 5: x
// 4096 x 4096 M = 96 820-836 / 870-908, 128 888-893 / 977-1004, 192 884 / 916-917, 256 898-901 /
// 907-928; 128 x 2048 x 4096 (8 MiB) 858-881 / 876-900; 256 x 11008 x 4096 888-898 / 940. Below
// 8 MiB the tiles keep M > 32: 256 x 1024 x 1024 816-836 / 757-772, 256 x 2048 x 2048 866-872 /
// 849-853, 128 x 1024 x 1024 774-854 / 757-890. A B left as its rows (a QTensor) would be packed
// first: there the tiles, which widen its rows directly, are faster from M = 48 (128 x 4096 x
// 4096: 862-874 / 806-812).
constexpr int64_t avx512_small_m_max = 32, avx512_small_m_max_large_b = 256, avx512_large_b_bytes = int64_t(8) << 20;
// Folding (gemm.cpp) on the tiles alone: the small-M kernel promotes each group, and a given M
// takes one or the other by the thread count, where D must not depend on it. 2048^3, 2 threads,
// Zen 5, GFLOP/s before / after: mx32 748-765 / 819-852 on a PackedWeight, 603-758 / 736-839 on a
// QTensor B (its rows widened, then folded); block scaling with power-of-two scales 755-764 /
// 810-826 (tensorwise 898-915).
constexpr int64_t avx512_fold_min_m = avx512_small_m_max_large_b + 1;

// ---- tiles: an R x 16 NJ block of C in zmm accumulators, over K pairs of a bf16 window ----
// The window's strip t is at b + t * b_strip; its K pair P is one 64-byte row, lane c holding
// (B[c, 2P], B[c, 2P + 1]) (the codes' pair order, widened). A row's pair (A[r, 2P], A[r, 2P + 1])
// is one 32-bit broadcast. R x NJ = 16 accumulators: VDPBF16PS has a latency of about 6 cycles
// and two issue per cycle on Zen 5, so 12 or more independent chains keep it busy; the R
// broadcasts and NJ loads per pair (10 or 17 loads per 16 VDPBF16PS) stay within two loads a cycle.
// With a promotion the pairs are its K groups, each summed from zero and promoted into c as it is
// stored - promote_loop's arithmetic (K's first group multiplied, the next fused in with one
// FMA), without a pass through a partial-sum buffer: block scaling at 2048 x 4096 x 4096 went
// from 847-870 to 929-933 GFLOP/s (Zen 5, 2 threads; rowwise, one group, 975). A slice's groups
// pass in one call, where each 128-wide group was a call of its own, its setup (eight row
// addresses, some spilled to vector registers) a tenth of the call's samples: block scaling at
// 2048^3 873-890 -> 880-920 GFLOP/s; in one bench gemm run block / tensorwise 0.90-0.96 -> 0.93-0.97.
template <int R, int NJ>
void micro(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t b_strip, int64_t pairs, float* c,
           int64_t ldc, bool accumulate, const Promotion* promotion) {
    const int64_t groups = promotion == nullptr ? 1 : promotion->groups;
    const int64_t group_pairs = pairs / groups;
    for (int64_t g = 0; g < groups; ++g) {
        __m512 acc[R][NJ];
        FP8KIT_UNROLL(16)
        for (int r = 0; r < R; ++r) {
            FP8KIT_UNROLL(2)
            for (int j = 0; j < NJ; ++j) {
                acc[r][j] = accumulate ? _mm512_loadu_ps(c + r * ldc + j * gemm_tile) : _mm512_setzero_ps();
            }
        }
        FP8KIT_UNROLL(2)
        for (int64_t p = g * group_pairs; p < (g + 1) * group_pairs; ++p) {
            __m512bh bv[NJ];
            FP8KIT_UNROLL(2)
            for (int j = 0; j < NJ; ++j) bv[j] = std::bit_cast<__m512bh>(_mm512_loadu_si512(b + j * b_strip + 2 * gemm_tile * p));
            FP8KIT_UNROLL(16)
            for (int r = 0; r < R; ++r) {
                int32_t two;
                std::memcpy(&two, a + r * lda + 2 * p, 4);
                const __m512bh av = std::bit_cast<__m512bh>(_mm512_set1_epi32(two));
                FP8KIT_UNROLL(2)
                for (int j = 0; j < NJ; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
            }
        }
        if (promotion == nullptr) {
            FP8KIT_UNROLL(16)
            for (int r = 0; r < R; ++r) {
                FP8KIT_UNROLL(2)
                for (int j = 0; j < NJ; ++j) _mm512_storeu_ps(c + r * ldc + j * gemm_tile, acc[r][j]);
            }
            return;
        }
        const Promotion pg = promotion->part(g, 1);
        __m512 sb[NJ];
        FP8KIT_UNROLL(2)
        for (int j = 0; j < NJ; ++j) sb[j] = _mm512_loadu_ps(pg.sb + j * pg.sb_strip);
        FP8KIT_UNROLL(16)
        for (int r = 0; r < R; ++r) {
            const __m512 sa = _mm512_set1_ps(pg.sa[r * pg.sa_stride]);
            FP8KIT_UNROLL(2)
            for (int j = 0; j < NJ; ++j) {
                float* out = c + r * ldc + j * gemm_tile;
                const __m512 scale = _mm512_mul_ps(sa, sb[j]);
                _mm512_storeu_ps(out, pg.first ? _mm512_mul_ps(acc[r][j], scale) : _mm512_fmadd_ps(acc[r][j], scale, _mm512_loadu_ps(out)));
            }
        }
    }
}

// K is swept in slices of 256: two strips' slice of B (16 KiB) and the block's rows of A (16 KiB)
// stay in L1 while every row group passes; the accumulators go through c between slices, which
// keeps each element's pairs added in K order. With a promotion a slice is whole K groups (of
// at most 256: block_avx512 takes longer ones).
constexpr int64_t slice_chunks = 8;
void sweep_slices(int block_m, int nj, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t b_strip, int64_t kn,
                  float* c, int64_t ldc, bool accumulate, const Promotion* promotion) {
    const int64_t group = promotion == nullptr ? kn : kn / promotion->groups;  // elements of K a group
    const int64_t slice = promotion == nullptr ? slice_chunks * gemm_chunk : slice_chunks * gemm_chunk / group * group;
    const int64_t rows = (block_m + gemm_tile - 1) / gemm_tile * gemm_tile;  // whole tiles
    for (int64_t k0 = 0; k0 < kn; k0 += slice) {
        const int64_t pairs = std::min(slice, kn - k0) / 2;
        const bool add = accumulate || (promotion == nullptr && k0 > 0);
        const uint16_t* bk = b + k0 * gemm_tile;  // K pair k0 / 2 of strip 0
        Promotion rows_r{};  // the promotion of the slice's groups for the rows from r: their scales of A
        const auto promotion_from = [&](int64_t r) -> const Promotion* {
            if (promotion == nullptr) return nullptr;
            rows_r = promotion->part(k0 / group, 2 * pairs / group);
            rows_r.sa += r * promotion->sa_stride;
            return &rows_r;
        };
        if (nj == 2) {
            for (int64_t r = 0; r < rows; r += 8) {
                micro<8, 2>(a + r * lda + k0, lda, bk, b_strip, pairs, c + r * ldc, ldc, add, promotion_from(r));
            }
        } else {
            for (int64_t r = 0; r < rows; r += gemm_tile) {
                micro<16, 1>(a + r * lda + k0, lda, bk, b_strip, pairs, c + r * ldc, ldc, add, promotion_from(r));
            }
        }
    }
}

void block_plain(int rows, int nj, const uint16_t* a, int64_t lda, const void* b, int64_t b_strip, int64_t chunks,
                 float* c, int64_t ldc, bool accumulate) {
    sweep_slices(rows, nj, a, lda, static_cast<const uint16_t*>(b), b_strip, chunks * gemm_chunk, c, ldc, accumulate, nullptr);
}

// A group longer than a slice (block scaling wider than 256) is summed through a buffer first.
void block_avx512(int rows, int nj, const uint16_t* a, int64_t lda, const void* b, int64_t b_strip, int64_t chunks,
                  float* c, int64_t ldc, bool accumulate, const Promotion* promotion) {
    const auto* bw = static_cast<const uint16_t*>(b);
    if (promotion != nullptr && chunks / promotion->groups > slice_chunks) {
        const int64_t cpg = chunks / promotion->groups;
        for (int64_t i = 0; i < promotion->groups; ++i) {
            const Promotion one = promotion->part(i, 1);
            block_then_promote<&block_plain>(rows, nj, a + i * cpg * gemm_chunk, lda, bw + i * cpg * gemm_chunk_codes, b_strip,
                                             cpg, c, ldc, false, &one);
        }
        return;
    }
    sweep_slices(rows, nj, a, lda, bw, b_strip, chunks * gemm_chunk, c, ldc, accumulate, promotion);
}

// cpuid leaf 7: ECX 1 AVX512-VBMI (the widening's byte permutes); subleaf 1: EAX 5 AVX512-BF16.
// (AVX512F/BW/VL and the OS's zmm state are the avx512 ISA path's own check, runtime.cpp.)
bool vbmi_and_bf16() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !((ecx >> 1) & 1u)) return false;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 5) & 1u);
}

// The layer ops' float32 matmul stays AVX2's (VDPBF16PS would round its float32 inputs to bf16).
constexpr GemmKernels avx512_kernels{&expand_vbmi, &widen_bf16<&expand_vbmi>, 2, 8, 32, 32, 0, 2, 0, &block_avx512, true,
                                     &no_tile_state, &no_tile_state, &small_bf16<avx512_one_row>, &small_pack_avx512,
                                     avx512_small_m_max, avx512_small_m_max_large_b, avx512_large_b_bytes, 0, &matmul_f32_avx2, &scale_store_avx512, &gelu_row_loop, &fold_vbmi, &widen_fold_vbmi, avx512_fold_min_m,
                                     &pack_group_avx512, &mark_strip_avx512, &widen_rows_vbmi, "avx512-bf16"};

}  // namespace

const GemmKernels* avx512_gemm_kernels() {
    static const GemmKernels* kernels = vbmi_and_bf16() ? &avx512_kernels : nullptr;
    return kernels;
}

}  // namespace fp8kit::cpu
