// src/cpu/gemm_amx.cpp: the GEMM kernels on Intel AMX (TDPBF16PS on 16x16 float32 tiles), with
// the AVX-512 VBMI widening (FP8 -> bf16 byte tables, src/cpu/widen_vbmi.hpp): tiles over widened
// windows of B, a streaming tile kernel for 2 <= M <= 128 and, where the CPU has AVX512-BF16,
// src/cpu/gemm_avx512.cpp's small-M kernel for M = 1. Built with -mamx-tile -mamx-bf16 -mavx512*; used
// only when cpuid reports AMX-TILE, AMX-BF16 and AVX512-VBMI, XCR0 has the tile state, and
// (Linux) the kernel grants this process the tile data state. Checked against the reference
// backend by tests/ops/test_gemm.cpp (the avx512 ISA path on an AMX machine).
#include <immintrin.h>

#include <cpuid.h>

#include "cpu/gemm_kernels.hpp"
#include "cpu/widen_vbmi.hpp"
#include "platform/platform.hpp"

namespace fp8kit::cpu {

namespace {

// ---- tiles: 0-3 the 2x2 C block, 4-5 A, 6-7 B; all 16 rows x 64 bytes ----
struct TileConfig {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

constexpr TileConfig tile_config() {
    TileConfig cfg{};
    cfg.palette = 1;
    for (int i = 0; i < 8; ++i) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    return cfg;
}

// A constant in memory: GCC's _tile_loadconfig does not tell the optimizer that it reads all 64
// bytes, and drops stores into a local configuration it thinks are dead.
alignas(64) constexpr TileConfig config = tile_config();

void amx_begin() { _tile_loadconfig(&config); }

void amx_end() { _tile_release(); }

// The 2x2 C block's tile steps, shared by block_amx (B from a widened window) and stream_strips
// (B from a chunk widened into L1): MI A tiles (a0; a1 16 rows below) times NJ B tiles (b0, b1).
template <int MI, int NJ>
void zero_c() {
    _tile_zero(0);
    if constexpr (NJ > 1) _tile_zero(1);
    if constexpr (MI > 1) _tile_zero(2);
    if constexpr (MI > 1 && NJ > 1) _tile_zero(3);
}

template <int MI, int NJ>
void store_c(float* c, int64_t ldc) {
    const int64_t sc = ldc * 4;
    _tile_stored(0, c, sc);
    if constexpr (NJ > 1) _tile_stored(1, c + gemm_tile, sc);
    if constexpr (MI > 1) _tile_stored(2, c + gemm_tile * ldc, sc);
    if constexpr (MI > 1 && NJ > 1) _tile_stored(3, c + gemm_tile * ldc + gemm_tile, sc);
}

template <int MI, int NJ>
void load_c(const float* c, int64_t ldc) {
    const int64_t sc = ldc * 4;
    _tile_loadd(0, c, sc);
    if constexpr (NJ > 1) _tile_loadd(1, c + gemm_tile, sc);
    if constexpr (MI > 1) _tile_loadd(2, c + gemm_tile * ldc, sc);
    if constexpr (MI > 1 && NJ > 1) _tile_loadd(3, c + gemm_tile * ldc + gemm_tile, sc);
}

template <int MI, int NJ>
void step_c(const uint16_t* a0, const uint16_t* a1, int64_t sa, const uint16_t* b0, const uint16_t* b1) {
    _tile_loadd(4, a0, sa);
    _tile_loadd(6, b0, 64);
    if constexpr (NJ > 1) _tile_loadd(7, b1, 64);
    if constexpr (MI > 1) _tile_loadd(5, a1, sa);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NJ > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MI > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MI > 1 && NJ > 1) _tile_dpbf16ps(3, 5, 7);
}

template <int MI, int NJ>
void block_amx(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t b_strip, int64_t chunks, float* c,
               int64_t ldc, bool accumulate) {
    const int64_t sa = lda * 2;
    const uint16_t* a1 = a + gemm_tile * lda;
    const uint16_t* b1 = b + b_strip;
    if (accumulate) {
        load_c<MI, NJ>(c, ldc);
    } else {
        zero_c<MI, NJ>();
    }
    for (int64_t q = 0; q < chunks; ++q) {
        step_c<MI, NJ>(a + q * gemm_chunk, a1 + q * gemm_chunk, sa, b + q * gemm_chunk_codes, b1 + q * gemm_chunk_codes);
    }
    store_c<MI, NJ>(c, ldc);
}

void block_dispatch(int rows, int nj, const uint16_t* a, int64_t lda, const void* bw, int64_t b_strip,
                    int64_t chunks, float* c, int64_t ldc, bool accumulate) {
    const auto* b = static_cast<const uint16_t*>(bw);
    const int64_t mi = (rows + gemm_tile - 1) / gemm_tile;
    if (mi == 2 && nj == 2) return block_amx<2, 2>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
    if (mi == 2) return block_amx<2, 1>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
    if (nj == 2) return block_amx<1, 2>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
    block_amx<1, 1>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
}

// GemmKernels::small of the AMX sets: a single row on the AVX512-BF16 small-M kernel where the CPU
// has it (two VDPBF16PS per 64 codes, src/cpu/gemm_avx512.cpp), else strip pairs through
// stream_strips. 2 threads, e4m3 rowwise A cast in the call, 4 x 4096 x 4096 weights in turn (L3),
// GFLOP/s, two runs each, against run_tiles (2026-11-26, each block of 32 rows widening the pair
// again): M = 2 125-130 (VDPBF16PS 95-99, tiles 92-95), M = 4 248-258 (97-108), 16 842-879
// (288-399), 32 1395-1413 (633-667), 48 1265-1333 (849-927), 64 1389-1654 (1054-1098), 96 1691-1702
// (1265-1350), 128 1670-1678 (1406-1605); at 256 alike (1523-1711 against 1575-1730), at 512 the
// tiles' window wins (1709-1871 against 1305-1351): up to 128 rows here (with one widening for all
// the blocks, 256 rows were still 1.1-1.4x slower than the window, 2026-12-02). At M = 1 VDPBF16PS
// keeps ~1.3x the streaming tiles' rate (12 cycles per 64 codes against 13.5-16, docs/PERF.md).
constexpr int64_t amx_small_m_max = 128;

// ---- small M on the tiles: B widened into L1 a slice at a time, straight into the tile unit ----
// Up to 128 packed rows of A (blocks of 32: one or two A tiles) against two strips of B. run_tiles
// widens a window of B (64 chunks of 8 strips) into L2 and tile-loads it back for each block of
// rows, which made M = 16 read its codes at half the rate of M = 1; here a slice of the two strips'
// chunks is widened into L1 and every block of rows takes it from there. The sums are the tiles':
// TDPBF16PS over the chunks in K order into zeroed C tiles, each K group's sums promoted by
// promote_loop (one group: the raw sums, scaled in the epilogue), so D is bit for bit what
// run_tiles gives; folded, every chunk's widened codes are folded as run_tiles folds its window and
// K is summed as one group. A single block (Hold) keeps its C tiles over its slice of K (small_amx
// cuts K so that A fits L2), a widened slice being one chunk; with more, each block's C goes to
// acc (or to its rows of part) between widened slices and is loaded back.
// A B left as its rows (PackedB::rows: a QTensor B taken for one call) is widened from them a
// slice at a time (widen_vbmi.hpp's widen_rows), where gemm() packed it in the call first - a pass over B and
// a copy of it. QTensor B, 2 threads, B in L3, the two builds alternated (2026-12-02), ms: 128 x
// 4096 x 4096 2.87-2.96 -> 2.30-2.35 (B packed ahead: 2.0), 16 x 4096 x 4096 1.30-1.34 -> 0.89-0.96,
// 64 x 2048 x 2048 0.49-0.51 -> 0.35-0.36; a software prefetch of the rows one, two or four slices
// ahead changed nothing beyond the noise. The slices are widened with the kernel's Widen, not one
// built per slice (its tables loaded again each time): 16 x 4096 x 4096 out of cache 1.10-1.13 ->
// 0.94-0.95 ms, 128 x 4096 x 4096 in L3 2.55-2.60 -> 2.45.
// Widened once for every block, not once per block: 2 threads, e4m3 tensorwise A, weights in L3,
// the best call of 1.2 s, the two builds alternated (2026-12-02), us: 48 x 4096 x 4096 1079-1091
// -> 858-861, 128 x 4096 x 4096 2407-2550 -> 1922-1952, 128 x 11008 x 4096 6366-6435 -> 5231-5268,
// 128 x 2048 x 2048 639-656 -> 511-517; block scaling 128 x 4096 x 4096 3159-3217 -> 2499-2587;
// 16 rows (one block) 470-472 -> 476-478. Slices of 2, 4, 8 and 16 chunks tried: 4 was best or
// within 3% of it at M = 48-128 (8 and 16 crowd L1 with A's rows; 2 loads and stores C too often).
constexpr int64_t stream_slice_chunks = 4;
// A slice of K whose A (all the rows) each strip pair reads, held in a quarter of a Sapphire Rapids
// core's 2 MiB L2 beside the strips' widened slices, B's lines streaming through and the sums:
// A is read from memory once a slice, not once a strip pair, and B once. Bands of rows whose A
// fitted 1.5 MiB (before 2026-12-02) read B and widened it once a band. 2 threads, e4m3
// tensorwise, weights in L3, the best call of 20-40, the two builds alternated twice (2026-12-02),
// us: 128 x 4096 x 11008 7762-7970 -> 6885-7101, 96 x 4096 x 11008 5778-6354 -> 5353-5476, 128 x
// 4096 x 14336 12570-12586 -> 9419-9424, 128 x 4096 x 4096 (one slice before) 2393-2404 ->
// 2135-2237, 100 x 2048 x 2048 539-560 -> 497-510; block scaling 128 x 4096 x 11008 9368-9717 ->
// 9061-9192; 16 x 4096 x 11008 alike. Slices whose A fits 1.5 MiB, 1 MiB, 768, 512, 384 and 256
// KiB: 512 was best or within the noise of it at M = 48-128.
constexpr int64_t amx_stream_a_bytes = int64_t(512) << 10;

// One block of rows over a widened slice (b0, b1: chunk q0 of the first and last strip, the next
// chunks gemm_chunk_codes apart): C zeroed where the slice starts the block's sum (zero), else
// loaded from c where the tiles do not hold it (load); stored to c where asked (store).
template <int MI, int NJ>
void rows_over_slice(const uint16_t* a, int64_t sa_bytes, const uint16_t* b0, const uint16_t* b1, int64_t q0,
                     int64_t chunks, bool zero, bool load, bool store, float* c, int64_t ldc) {
    if (zero) {
        zero_c<MI, NJ>();
    } else if (load) {
        load_c<MI, NJ>(c, ldc);
    }
    const uint16_t* a1 = a + gemm_tile * (sa_bytes / 2);
    for (int64_t i = 0; i < chunks; ++i) {
        const int64_t q = q0 + i;
        step_c<MI, NJ>(a + q * gemm_chunk, a1 + q * gemm_chunk, sa_bytes, b0 + i * gemm_chunk_codes, b1 + i * gemm_chunk_codes);
    }
    if (store) store_c<MI, NJ>(c, ldc);
}

// Chunks [q_begin, q_end) of K of the strips s and s + 1 (NJ = 2) for `rows` rows of A - whole K
// groups where each group's sums are promoted; the sums over K continue in acc from one such call
// to the next.
template <int NJ, bool Hold>
void stream_strips(const uint16_t* a, int64_t lda, const PackedB& b, int64_t s, int64_t rows, const float* sa,
                   const Widen& widen, bool fold, int64_t q_begin, int64_t q_end, float* acc, int64_t ldacc) {
    const KLayout& kl = b.kl;
    const int64_t cpg = kl.chunks_per_group(), total = kl.padded / gemm_chunk, sa_bytes = lda * 2;
    const int64_t blocks = Hold ? 1 : (rows + 2 * gemm_tile - 1) / (2 * gemm_tile);
    constexpr int64_t slice = Hold ? 1 : stream_slice_chunks;
    const uint8_t* codes[NJ];
    const uint8_t* specials[NJ];  // the strips' chunk_specials
    bool nan[NJ];
    for (int j = 0; j < NJ; ++j) {
        codes[j] = b.rows == nullptr ? b.strip(s + j) : nullptr;
        specials[j] = &b.specials(s + j, 0);
        nan[j] = widen.neg_zero_is_nan && b.strip_nonfinite[size_t(s + j)] != 0;
    }
    // The strips' lines prefetched into L1 this many chunks ahead: with one A tile (at most 16
    // rows) the codes stream fastest, and a prefetch that waits long for its line holds one of the
    // core's 16 fill buffers the while (weights out of cache, the best call of 1.5 s, the settings
    // alternated in one process, 2026-12-02): 8 x 4096 x 4096 584-586 us with 8 ahead, 510-518
    // with 4, 506-518 with 2, 584-598 with none, 626-661 with 16; 16 rows 584-597 / 536-540;
    // 8 x 11008 x 4096 1613-1627 / 1420-1515. With more rows 8 (128 x 4096 x 4096 2154-2254
    // against 2366-2416 with 4; 32 rows alike).
    const int64_t ahead = rows <= gemm_tile ? 4 : 8;
    // Two slices' room, by slice parity: widening the next slice while the tiles load this one.
    alignas(64) uint16_t wide[2][NJ][stream_slice_chunks][gemm_chunk_codes];
    alignas(64) float part[amx_small_m_max][2 * gemm_tile];  // a group's sums, row by row
    const bool summed = kl.groups == 1 || fold;  // one sum over K: into acc, unpromoted
    // Folded, every group's scales of the strips are read before its first chunk is widened: with B
    // streamed from memory each group would wait for its line, so all of them (a strip's lie
    // together, PackedB::sb) are asked for at once.
    const int64_t g_end = (q_end + cpg - 1) / cpg;
    for (int64_t g = q_begin / cpg; fold && g < g_end; ++g) {
        for (int j = 0; j < NJ; ++j) _mm_prefetch(reinterpret_cast<const char*>(b.sb(s + j, g)), _MM_HINT_T0);
    }
    int64_t slices = 0;
    for (int64_t g = q_begin / cpg; g < g_end; ++g) {
        __m512i add[NJ], arith_add[NJ];
        for (int j = 0; fold && j < NJ; ++j) {
            add[j] = fold_add_lanes(b.sb(s + j, g));
            arith_add[j] = widen.arith_fold_add(add[j]);
        }
        const int64_t g_last = std::min((g + 1) * cpg, q_end);
        for (int64_t q0 = std::max(g * cpg, q_begin); q0 < g_last; q0 += slice) {
            const int64_t chunks = std::min(slice, g_last - q0);
            uint16_t (&w)[NJ][stream_slice_chunks][gemm_chunk_codes] = wide[slices++ & 1];
            for (int j = 0; b.rows != nullptr && j < NJ; ++j) {  // B left as its rows (gemm() says when)
                const int64_t j0 = (s + j) * gemm_tile;
                widen_rows(widen, b.rows + j0 * b.ld, b.ld, std::min(gemm_tile, b.n - j0), q0 * gemm_chunk, chunks, kl.k,
                           w[j][0]);
            }
            for (int64_t i = 0; b.rows == nullptr && i < chunks; ++i) {
                const int64_t q = q0 + i;
                for (int j = 0; j < NJ; ++j) {
                    for (int line = 0; line < gemm_chunk_codes / 64; ++line) {
                        _mm_prefetch(reinterpret_cast<const char*>(codes[j] + (q + ahead) * gemm_chunk_codes + line * 64), _MM_HINT_T0);
                    }
                }
                for (int j = 0; j < NJ; ++j) {
                    const unsigned special = fold ? specials[j][q] : 0u;
                    for (int line = 0; line < gemm_chunk_codes / 64; ++line) {
                        __m512i w0, w1;
                        const uint8_t* c = codes[j] + q * gemm_chunk_codes + 64 * line;
                        if (fold) {
                            widen_fold_line(widen, c, (special >> line) & 1u, nan[j], add[j], arith_add[j], w0, w1);
                        } else {
                            widen(c, w0, w1, nan[j]);
                        }
                        _mm512_store_si512(w[j][i] + 64 * line, w0);
                        _mm512_store_si512(w[j][i] + 64 * line + 32, w1);
                    }
                }
            }
            // Summed, a block's C runs over all of K in acc; else over the group, in part, then
            // promoted into acc as run_tiles does. Held in the tiles (one block), C is loaded and
            // stored only at the ends of [q_begin, q_end).
            const bool first = summed ? q0 == 0 : q0 == g * cpg;
            const bool last = summed ? q0 + chunks == total : q0 + chunks == (g + 1) * cpg;
            const bool load = !first && (!Hold || q0 == q_begin), store = !Hold || last || q0 + chunks == q_end;
            for (int64_t blk = 0; blk < blocks; ++blk) {
                const int64_t r0 = blk * 2 * gemm_tile;
                const uint16_t* ar = a + r0 * lda;
                float* c = summed ? acc + r0 * ldacc : &part[r0][0];
                const int64_t ldc = summed ? ldacc : 2 * gemm_tile;
                if (rows - r0 > gemm_tile) {
                    rows_over_slice<2, NJ>(ar, sa_bytes, w[0][0], w[NJ - 1][0], q0, chunks, first, load, store, c, ldc);
                } else {
                    rows_over_slice<1, NJ>(ar, sa_bytes, w[0][0], w[NJ - 1][0], q0, chunks, first, load, store, c, ldc);
                }
                if (!summed && last) {
                    promote_loop(c, std::min<int64_t>(2 * gemm_tile, rows - r0), NJ * gemm_tile, sa + r0 * kl.groups + g,
                                 kl.groups, b.sb(s, g), b.sb_strip(), acc + r0 * ldacc,
                                 ldacc, g == 0);
                }
            }
        }
    }
}

template <bool Bf16Rows>
void small_amx(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
               const float* sa, const ExpandTable& t, bool fold, float* acc, int64_t ldacc) {
    if (Bf16Rows && rows <= 1) return small_bf16<amx_one_row>(rows, a, lda, b, s0, s1, sa, t, false, acc, ldacc);
    const Widen widen(t);
    amx_begin();
    // K in slices whose A (all the rows) fits amx_stream_a_bytes, as even as their unit allows:
    // whole K groups where each group's sums are promoted, else whole widened slices; every strip
    // pair runs over one slice before the next.
    const int64_t block = 2 * gemm_tile, total = b.kl.padded / gemm_chunk;
    const int64_t unit = b.kl.groups == 1 || fold ? stream_slice_chunks : b.kl.chunks_per_group();
    const int64_t a_chunk = round_up(rows, block) * gemm_chunk * 2;  // bytes of A in one chunk of K
    const int64_t most = std::max(unit, amx_stream_a_bytes / a_chunk / unit * unit);
    const int64_t slices = (total + most - 1) / most;
    const int64_t per = round_up((total + slices - 1) / slices, unit);
    for (int64_t q0 = 0; q0 < total; q0 += per) {
        for (int64_t s = s0; s < s1; s += 2) {
            const auto run = s + 1 < s1 ? (rows > block ? &stream_strips<2, false> : &stream_strips<2, true>)
                                        : (rows > block ? &stream_strips<1, false> : &stream_strips<1, true>);
            run(a, lda, b, s, rows, sa, widen, fold, q0, std::min(total, q0 + per), acc + (s - s0) * gemm_tile, ldacc);
        }
    }
    amx_end();
}

// cpuid leaf 7: EDX 22 AMX-BF16, 24 AMX-TILE; ECX 1 AVX512-VBMI. XCR0 17-18: tile config and
// data state enabled by the OS. The OS may further hand tile data out per process on request
// (Linux: arch_prctl ARCH_REQ_XCOMP_PERM), which the platform layer asks for.
bool amx_usable() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!((edx >> 22) & 1u) || !((edx >> 24) & 1u) || !((ecx >> 1) & 1u)) return false;
    const unsigned long long xcr0 = _xgetbv(0);
    if ((xcr0 & 0x60000ull) != 0x60000ull) return false;
    return platform::request_amx_tile_data();
}

// The float32 matmul of the layer ops is AVX2's (no AMX tile computes in float32).
// A window of 64 chunks (2048 of K, 512 KiB of bf16 B for 8 strips: a quarter of a Sapphire Rapids
// core's 2 MiB L2): each block loads and stores its four C tiles once per window, and with 32 chunks
// that traffic held the tiles back. 2 threads, e4m3 tensorwise, in cache, best of 3-10 calls, two
// runs each (2026-11-25): 2048^3 1544-1663 GFLOP/s with 32, 2033-2091 with 64, 1936-2014 with 128;
// 2048 x 4096 x 4096 1598-1698 / 2007-2063 / 1453-1485; M = 128 1568-1640 / 1764-1847 / 1810-1822;
// 8 and 16 chunks slower than 32 (2048^3: 1244, 1395).
// K up to 96 chunks (3072) is one window (GemmKernels::one_window_chunks): over a window of 64 and
// one of the rest, each task keeps all its rows' sums (1 MiB for 2048 rows of a panel) between the
// windows and finishes them from L2 and beyond. 2 threads, e4m3 tensorwise, median of paired calls,
// 64-chunk windows' time over one window's (2026-12-01): 4096 x 512 x 2560 1.14-1.17, 2048 x 2048 x
// 2560 1.24, 2048 x 4096 x 3072 1.17, 2048 x 11008 x 2560 1.24; bf16 A weight-only 4096 x 512 x 2560
// 1.13-1.19, 4096 x 3072 x 3072 1.10; the block recipe 1.01-1.02. Two windows of 40 at K = 2560
// were 1.14 too. At K = 4096 one window and two were within the noise (0.98-1.01), at K = 11008
// windows of 128 0.985 of 64s.
constexpr int64_t amx_one_window_chunks = 96;
// A panel's window held at what 8 strips of 64 chunks take (512 KiB of bf16, GemmKernels::
// panel_window_bytes): where K is short, a panel takes more strips, so that A's rows, read again
// for each panel, are read fewer times. Paired calls, 2 threads (2026-12-01), 8-strip panels' time
// over the wider ones': K = 512 (32 strips) 4096 x 2048 1.18-1.21 (e4m3, bf16 A, fused rowwise cast),
// 4096 x 4096 1.24-1.29, 2048 x 8192 1.20, 512 x 2048 1.06, 256 x 4096 1.07; K = 1024 (16 strips)
// 4096 x 2048 1.08, 4096 x 3072 1.09, 2048 x 4096 1.10, 1024^2 1.02. 32 strips at K = 2048 and 4096
// (2 MiB windows): 0.78-0.86, and 64 strips at K = 512 were no faster than 32.
constexpr int64_t amx_panel_window_bytes = int64_t(512) << 10;
// Row bands while B's codes are at most 1 MiB (GemmKernels::row_band_max_b). 2 threads, e4m3
// tensorwise, best call of 3 s, bands against panels (2026-11-28): 512^3 118-124 us against 177-194,
// 1024^3 1055 against 1284, 256 x 1024 x 1024 262 against 302; even at 1536^3 (2.25 MiB of
// codes); 2048^3 and 2048 x 1024 x 4096 (4 MiB) 8053 / 10504 against 7641 / 7945.
constexpr int64_t amx_row_band_max_b = int64_t(1) << 20;
constexpr GemmKernels amx_kernels{&expand_vbmi, &widen_bf16<&expand_vbmi>, 2, 8, 64, amx_one_window_chunks, amx_panel_window_bytes, 2, amx_row_band_max_b, &block_then_promote<&block_dispatch>, false,
                                  &amx_begin, &amx_end, &small_amx<false>, nullptr, amx_small_m_max, amx_small_m_max, 0, amx_small_m_max, &matmul_f32_avx2,
                                  &scale_store_loop, &gelu_row_loop, &fold_vbmi, &widen_fold_vbmi, 1, &pack_group_avx512, &mark_strip_avx512, &widen_rows_vbmi, "amx"};
// With AVX512-BF16: its bf16 conversion in the epilogue (scale_store_avx512), and M = 1 on
// src/cpu/gemm_avx512.cpp's small kernel, two strips at once (small_strips_for), which does not
// fold (so folding starts at M = 2); 2 <= M <= 128 streams through the tiles (small_amx).
constexpr GemmKernels amx_bf16_kernels{&expand_vbmi, &widen_bf16<&expand_vbmi>, 2, 8, 64, amx_one_window_chunks, amx_panel_window_bytes, 2, amx_row_band_max_b,
                                       &block_then_promote<&block_dispatch>, false, &amx_begin, &amx_end, &small_amx<true>, nullptr,
                                       amx_small_m_max, amx_small_m_max, 0, amx_small_m_max, &matmul_f32_avx2, &scale_store_avx512, &gelu_row_loop, &fold_vbmi, &widen_fold_vbmi, 2,
                                       &pack_group_avx512, &mark_strip_avx512, &widen_rows_vbmi, "amx"};

}  // namespace

const GemmKernels* amx_gemm_kernels() {
    static const GemmKernels* kernels = !amx_usable()                  ? nullptr
                                        : avx512_gemm_kernels() != nullptr ? &amx_bf16_kernels
                                                                           : &amx_kernels;
    return kernels;
}

}  // namespace fp8kit::cpu
