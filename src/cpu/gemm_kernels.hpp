// src/cpu/gemm_kernels.hpp: the packed operand layouts of the cpu GEMM and the kernel table
// that computes on them: Intel AMX tiles (src/cpu/gemm_amx.cpp) where the CPU and OS allow,
// AVX512-BF16 dot products (src/cpu/gemm_avx512.cpp) on CPUs that have them without AMX (Zen 4,
// Zen 5), AVX2 + FMA float32 tiles (src/cpu/gemm_avx2.cpp) on other x86-64 CPUs, a portable
// float32 kernel (src/cpu/gemm.cpp) elsewhere. All are checked against the reference backend by
// tests/ops/test_gemm.cpp, on every ISA path.
//
// Why bf16: every e4m3 / e5m2 value is exact in bf16, and the product of two of them is exact
// in float32 (at most 4 x 4 significant bits, exponents within float32's range), so a
// bf16 x bf16 -> float32 dot product (AMX TDPBF16PS) computes FP8 products exactly and
// accumulates them in float32: the numerics of NUMERICS.md at the speed of the tile unit.
// Codes are widened (to bf16, or to float32 for the AVX2 tiles: exact too) only in cache-sized
// pieces; B stays FP8 (one byte per weight) in memory, so the decode (small M) case streams a
// quarter of what f32 weights would take.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "fp8kit/format.hpp"

// Loop unrolling asked of GCC and clang (both read `#pragma GCC unroll`); other compilers
// choose themselves, and would warn about the unknown pragma. The kernels' accumulator arrays
// stay in registers only when their loops are unrolled.
#if defined(__GNUC__)
#define FP8KIT_PRAGMA(x) _Pragma(#x)
#define FP8KIT_UNROLL(n) FP8KIT_PRAGMA(GCC unroll n)
#else
#define FP8KIT_UNROLL(n)
#endif

namespace fp8kit::cpu {

inline constexpr int64_t gemm_tile = 16;   // rows of an A tile; columns (n) of a B strip
inline constexpr int64_t gemm_chunk = 32;  // K per tile step: 16 rows of 32 bf16 (64 bytes)
inline constexpr int64_t gemm_chunk_codes = gemm_tile * gemm_chunk;  // 512 codes per B tile

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// K in packed form: each scale group of `group` elements starts at a multiple of 32 and is
// zero-padded to `group_padded`, so tile steps never straddle two groups' scales.
struct KLayout {
    int64_t k, group, groups, group_padded, padded;
    KLayout(int64_t k_, int64_t group_)
        : k(k_), group(group_ < 1 ? 1 : group_), groups(k_ <= 0 ? 1 : (k_ + group - 1) / group),
          group_padded(round_up(group, gemm_chunk)), padded(groups * group_padded) {}
    int64_t chunks_per_group() const { return group_padded / gemm_chunk; }
    int64_t len(int64_t g) const { return std::min(group, k - g * group); }  // elements of group g
};

// B [n, k] packed once (PackedWeight): FP8 codes in 16-column strips; within a strip, one 512-byte
// tile per 32-wide K chunk in AMX's pair-interleaved ("VNNI") order: byte 32 p + 2 c + e holds
// B[16 s + c, 32 chunk + 2 p + e]. Padding codes are 0x00 (+0 in every format).
struct PackedB {
    int64_t n, strips;
    KLayout kl;
    Format format;
    // [strips][kl.padded / 32][512]; from detail::host_allocate_lasting for a PackedWeight (a large weight
    // on huge pages, sized to the byte), from host_allocate for a pack inside one GEMM call;
    // uninitialised until pack_weight writes every byte (padding included), in parallel: zeroing
    // 16 MiB on one thread took a fifth of a 4096 x 4096 pack.
    std::shared_ptr<std::byte> codes;
    // [strips][kl.groups][16]: strip s's 16 column scales of K group g at sb(s, g). Strip-major, so
    // that a strip's scales lie in K order next to each other, as the small-M kernels stream a strip
    // over K. Group-major, each group's line of a strip was strips x 64 bytes from the next, past
    // what the hardware prefetchers follow: block scaling at 1 x 4096 x 4096, 2 threads, weights
    // out of cache, 91-94 -> 94-98 GFLOP/s (Zen 5, the two builds alternated; tensorwise 98-104).
    std::vector<float> scales;
    // [strips]: 1 where a code of the strip is NaN or Inf (finite_code). Weights rarely hold one,
    // and the small-M kernels skip the fix-up of their in-register decode on strips that have none.
    std::vector<uint8_t> strip_nonfinite;
    // [strips][kl.padded / 32]: bit l of a chunk's byte is set where the chunk's line l (64 codes,
    // two K pairs of the strip) holds a code that is not a nonzero finite normal - a zero, a
    // subnormal, Inf or NaN (padding is +0). Such lines take the byte-table widening, the others
    // the arithmetic one (src/cpu/widen_vbmi.hpp), which cannot place those codes.
    std::vector<uint8_t> chunk_specials;
    // Whether every scale of B's columns is a power of two that folds (fold_log2): its K groups may
    // then be summed as one (gemm.cpp, "Folding").
    bool scales_fold;
    // A pack for one GEMM call (pack_weight, not lasting) leaves B's codes where they are: row j
    // at rows + j * ld (the caller's, alive for the call); codes is null, strip_nonfinite and
    // chunk_specials say "may be" everywhere. gemm() widens run_tiles' windows straight from the
    // rows where it can (GemmKernels::widen_rows) and packs the strips first where it cannot.
    const uint8_t* rows = nullptr;
    int64_t ld = 0;
    const uint8_t& specials(int64_t s, int64_t chunk) const { return chunk_specials[size_t(s * (kl.padded / gemm_chunk) + chunk)]; }
    const uint8_t* strip(int64_t s) const { return reinterpret_cast<const uint8_t*>(codes.get()) + s * kl.padded * gemm_tile; }
    const float* sb(int64_t s, int64_t g) const { return scales.data() + (s * kl.groups + g) * gemm_tile; }
    float* sb(int64_t s, int64_t g) { return scales.data() + (s * kl.groups + g) * gemm_tile; }
    int64_t sb_strip() const { return kl.groups * gemm_tile; }  // floats from a strip's sb to the next's
    size_t code_bytes() const { return size_t(strips * kl.padded * gemm_tile); }
};

// Whether a code is a nonzero finite normal of its format (PackedB::chunk_specials): its
// magnitude bits at least the smallest normal's and below the first Inf or NaN (e4m3fn 0x7f,
// e5m2 0x7c; the fnuz formats' NaN 0x80 has magnitude 0) - two byte compares, which vectorize.
constexpr uint32_t code_top(Format f) { return f == Format::e4m3fn ? 0x7fu : f == Format::e5m2 ? 0x7cu : 0x80u; }
constexpr bool normal_code(uint8_t code, Format f) {
    const uint32_t mag = code & 0x7fu;
    return mag >= (1u << format_info(f).mantissa_bits) && mag < code_top(f);
}
// Whether a code is a number (PackedB::strip_nonfinite): not NaN, nor e5m2's Inf.
constexpr bool finite_code(uint8_t code, Format f) {
    return !is_nan(code, f) && !(f == Format::e5m2 && (code & 0x7fu) == 0x7cu);
}
static_assert([] {  // against decode, every code of every format
    for (const Format f : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
        for (int c = 0; c < 256; ++c) {
            const float v = decode(uint8_t(c), f), mag = v < 0 ? -v : v;
            if (normal_code(uint8_t(c), f) != (mag >= format_info(f).min_normal && mag <= format_info(f).max)) return false;
            if (finite_code(uint8_t(c), f) != (mag <= format_info(f).max)) return false;
        }
    }
    return true;
}());

// fn(std::integral_constant<Format, f>{}) for one of the four FP8 formats: a loop over codes
// that calls a constexpr predicate with the format a constant is one the compiler vectorizes (a
// table lookup per code took half of a weight's pack).
template <class Fn>
decltype(auto) with_format(Format f, Fn&& fn) {
    switch (f) {
        case Format::e4m3fn: return fn(std::integral_constant<Format, Format::e4m3fn>{});
        case Format::e5m2: return fn(std::integral_constant<Format, Format::e5m2>{});
        case Format::e4m3fnuz: return fn(std::integral_constant<Format, Format::e4m3fnuz>{});
        default: return fn(std::integral_constant<Format, Format::e5m2fnuz>{});
    }
}

// The power of two the arithmetic widening (widen_vbmi.hpp) takes B's values down by, and A's up:
// e4m3fn 8, e4m3fnuz 7, e5m2 -16, e5m2fnuz -17.
constexpr int arith_unit_log2(Format f) {
    return f == Format::e4m3fn ? 8 : f == Format::e4m3fnuz ? 7 : f == Format::e5m2 ? -16 : -17;
}

// FP8 code -> bf16 bits for one format, whole and split into low / high bytes (for byte-table
// lookups): decode(code) x 2^-unit_log2, unit_log2 0 or arith_unit_log2 (exact either way: every
// FP8 value so scaled is a bf16 normal, zero, Inf or NaN).
struct ExpandTable {
    Format format;
    int unit_log2;
    uint16_t bf16[256];
    alignas(64) uint8_t lo[256];
    alignas(64) uint8_t hi[256];
};
const ExpandTable& expand_table(Format f, bool arith = false);  // arith: unit_log2 = arith_unit_log2(f)

// The scales of `groups` consecutive K groups, for their partial sums' promotion into the
// accumulator (DeepGEMM's): group i's row r, column 16 t + c (strip t, c < 16) gets
// sa[r * sa_stride + i] * sb[t * sb_strip + 16 i + c] (PackedB::sb's layout); first: group 0 is
// K's first (multiplied in, where the others are fused in by an FMA).
struct Promotion {
    const float* sa;
    int64_t sa_stride;
    const float* sb;
    int64_t sb_strip;
    bool first;
    int64_t groups = 1;
    // Groups [i, i + n) of these.
    Promotion part(int64_t i, int64_t n) const { return {sa + i, sa_stride, sb + i * gemm_tile, sb_strip, first && i == 0, n}; }
};

// The computing kernels. A is packed as bf16 rows [Mp][lda] in the K layout above; B pieces are
// widened by widen_b into windows of 512-element tiles, in the layout the block kernel reads.
inline constexpr int max_block_tiles = 3;  // the most row tiles a block kernel is given (GemmKernels)

struct GemmKernels {
    // out[i] = t.bf16[codes[i]] for i < n: FP8 codes to bf16 bits.
    void (*expand)(const uint8_t* codes, int64_t n, const ExpandTable& t, uint16_t* out);
    // B's codes (n a multiple of 512: whole tiles) into the window block() reads, `widened_bytes`
    // per element: bf16 tiles in the codes' pair order for the tile kernels (expand itself),
    // float32 rows of 16 columns in K order for the AVX2 kernel. nan: whether a code may be NaN or
    // Inf (PackedB::strip_nonfinite); false lets a kernel skip its fix-up for NaN codes.
    void (*widen_b)(const uint8_t* codes, int64_t n, const ExpandTable& t, bool nan, void* out);
    int64_t widened_bytes;
    // run_tiles' tiling: strips of B per task (128 columns for 8), K chunks of B widened per window,
    // and row tiles per block (a block is at most block_tiles x 16 rows). The bf16 tile kernels: 8
    // strips, 32 chunks (a 256 KiB window; 16 strips or 16 chunks ran 2-5% slower on Zen 5's
    // avx512-bf16 kernels; AMX: 64 chunks, src/cpu/gemm_amx.cpp says why), 2 row tiles. The
    // AVX2 kernel widens A's rows to float32 once per (task, window, block), so wider panels save it
    // work: 16 strips over a 4-chunk window (16 strips of float32 B, 128 KiB: an AVX2 machine's L2 is
    // 256-512 KiB) ran 4096^3 at 0.94-0.97x OpenBLAS sgemm where 8 strips over 16 chunks ran
    // 0.91-0.93x (alternating in one process, Zen 5); and 3 row tiles, 48 rows = 8 x 6 rows of its
    // micro kernel (32 rows took two 6-row and four slower 5-row calls). K of at most
    // one_window_chunks is one window whatever window_chunks says: run_tiles then keeps one block's
    // sums and finishes each block from L1, where over two windows it keeps every row's sums of the
    // task (AMX: 96, src/cpu/gemm_amx.cpp says why; the other sets: window_chunks, not measured).
    // Where panel_window_bytes is nonzero, a panel takes as many more strips as its window (of
    // window_chunks, or all of a shorter K) leaves room for in those bytes (AMX: 512 KiB, src/cpu/
    // gemm_amx.cpp says why; 0 elsewhere: panel_strips, not measured there).
    int64_t panel_strips, window_chunks, one_window_chunks, panel_window_bytes, block_tiles;
    // The most bytes of B's codes for which gemm() gives each thread a band of rows (every panel)
    // rather than panels (every row); 0: panels. In a band a thread reads only the rows of packed A
    // it packed itself and writes whole rows of D, where over panels each thread reads every row,
    // half of them from another core's cache; but each band widens and reads all of B, which
    // pays only while B is small beside a core's L2. AMX: 1 MiB (a Sapphire Rapids core's L2 is
    // 2 MiB); the other sets 0 (not measured there). Where the window of all of B's strips
    // (widened_bytes a code) fits in as many bytes too, a band takes them as one panel: the
    // window is widened once and each block of the band's A rows is read once for all strips,
    // where over panels of 8 strips the band's rows went through L2 once a panel.
    int64_t row_band_max_b;
    // C block of `rows` rows (1 .. block_tiles x 16, block_tiles <= max_block_tiles) and nj in {1, 2}
    // 16-column tiles: the sums over `chunks` K chunks of A rows (a + r * lda, chunk q at + 32 q)
    // times B strip tiles of the widened window (strip t at b + t * b_strip elements, chunk q at + 512
    // q elements), into c[r * ldc + col]. Without a promotion: added to c (accumulate) or written over
    // it. With one, the chunks are its K groups, each group's sums promoted into c as promote_loop does.
    // The AMX and AVX-512 kernels compute whole 16-row tiles (rows rounded up; A is padded to them),
    // the AVX2 kernel only the rows asked for: c's rows past `rows` are not to be read.
    void (*block)(int rows, int nj, const uint16_t* a, int64_t lda, const void* b, int64_t b_strip, int64_t chunks,
                  float* c, int64_t ldc, bool accumulate, const Promotion* promotion);
    // Whether block() takes a promotion of several K groups (a whole window's, Promotion::groups,
    // each group chunks / groups chunks); else run_tiles gives it one group a call.
    bool block_groups;
    void (*begin)();  // per thread, at the start of a task (AMX: tile configuration; AVX2: forget widened A)
    void (*end)();
    // Small M (null where the kernel set has none): all rows (<= small_m_max) of packed A times
    // strips [s0, s1) of b over all of K, FP8 codes widened as they are read (in registers, or
    // chunk by chunk into L1 for the AMX tiles; B streamed once, no widened window). Leaves in
    // acc[r * ldacc + col] what the block/promote loop would: the raw sum with one K group, else
    // the groups' partial sums times sa * sb, or with `fold` (only where fold_min_m <= rows) the
    // one sum of the folded operands. gemm() never splits rows between tasks here, so a kernel may
    // choose how it sums by `rows` (AMX: a single row on VDPBF16PS).
    void (*small)(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
                  const float* sa, const ExpandTable& t, bool fold, float* acc, int64_t ldacc);
    // Packed A's rows [0, rows) (row stride lda, k elements) into out (rows x k elements) in the
    // layout `small` reads, then with row stride k, once a call before its tasks, where rows >= 2:
    // a single row is read as it is (for every layout, its own interleaving). Null: `small` reads
    // packed A's rows as they are.
    void (*small_pack)(int64_t rows, const uint16_t* a, int64_t lda, int64_t k, uint16_t* out);
    // The largest M the small kernel takes (chosen by all of packed A's rows - two a row for a
    // weight-only f32 / f16 A - never by a task's rows, so which kernel rounds D does not depend
    // on the thread split); up to small_m_max_large_b where B was packed ahead (not left as its
    // rows) with at least large_b_bytes of codes, and its strips leave every thread two panels.
    // That choice depends on the thread count: a set takes small_m_max_large_b past small_m_max
    // only where its small kernel sums as its tiles do (the avx512-bf16 set; tests/ops/test_gemm.cpp
    // checks D bit for bit).
    int64_t small_m_max, small_m_max_large_b, large_b_bytes;
    // The most M (packed rows of A) for which the small kernel reads a B left as its rows
    // (PackedB::rows); 0: never, gemm() packs B first.
    int64_t small_rows_max_m;
    // The layer ops' float32 matmul (src/cpu/matmul.cpp): c[m, n] (+)= op(a)[m, k] . op(b)[k, n],
    // a stored [m, k] or [k, m] (ta), b [k, n] or [n, k] (tb); each element one float32 sum in k
    // order (src/cpu/matmul_kernel.hpp; on AVX2 the FP8 tiles' float32 kernel).
    void (*matmul_f32)(float* c, const float* a, bool ta, const float* b, bool tb, int64_t m, int64_t n, int64_t k,
                       bool accumulate);
    // The GEMM's epilogue where it only scales, adds a float32 bias or none and applies GELU or
    // not (gemm.cpp's finish_rows: one K group, no C): D's row segment out[j] = alpha * (v[j] *
    // (sa * sb[j])) (+ bias[j]), then gelu_epilogue where gelu, j < cols, as float32 or bf16
    // (scale_store_loop; in the kernel TU's vectors: built with baseline flags, the loop and the
    // store after it took a third of a 512^3 GEMM on the AMX tiles). v may be overwritten.
    void (*scale_store)(float* v, float alpha, float sa, const float* sb, const float* bias, bool gelu, void* out,
                        bool bf16_out, int64_t cols);
    // gelu_epilogue of v[j], j < cols, in place, in the kernel TU's vectors (gelu_row_loop): the
    // general epilogue's GELU (gemm.cpp's finish_rows), so that it takes the same FMA as
    // scale_store's - the hardware's, not the C library's fmaf, which MinGW's rounds 1 ulp off.
    void (*gelu_row)(float* v, int64_t cols) noexcept;
    // Power-of-two scales folded into the operands (gemm.cpp, "Folding"; null where the set does
    // not fold). fold: x[i] (bf16 bits, n a multiple of 32) gets add[i % 32] added where it is
    // nonzero and finite - fold_loop, in the set's vectors (A's packed rows). widen_fold: widen_b
    // of n codes (whole tiles) into bf16 tiles, folded as fold would; specials: the codes' chunks'
    // PackedB::chunk_specials, whose clear bits say a 64-code line is all nonzero finite normals
    // (which the AMX set widens by shifts, its exponent add taking the fold for free). Folding runs
    // where packed A has at least fold_min_m rows: every kernel the set runs there sums a folded K
    // as one group.
    void (*fold)(uint16_t* x, int64_t n, const int16_t* add);
    void (*widen_fold)(const uint8_t* codes, int64_t n, const ExpandTable& t, bool nan, const int16_t* add,
                       const uint8_t* specials, uint16_t* out);
    int64_t fold_min_m;
    // pack_weight's copy of one K group of a strip into PackedB's pair order: B's rows row0 + c * ld
    // (c < cols <= 16), elements [0, len) of each, into dst (the group's group_padded x 16 bytes,
    // zeroed by the caller where len or cols leave padding): byte 32 (e / 2) + 2 c + e % 2 of dst is
    // row c's element e - pack_group_loop, or AVX-512 gathers of 16 rows' element pairs.
    void (*pack_group)(const uint8_t* row0, int64_t ld, int64_t cols, int64_t len, uint8_t* dst);
    // pack_weight's scan of one packed strip of `lines` 64-code lines in format f (padding is +0):
    // sets PackedB::chunk_specials' bits (specials: the strip's bytes, zeroed by the caller) and
    // returns whether a code is NaN or Inf (PackedB::strip_nonfinite) - mark_strip_loop.
    bool (*mark_strip)(const uint8_t* strip, int64_t lines, Format f, uint8_t* specials);
    // widen_b of B's rows as packed, for a window of B left where it is (PackedB::rows): rows
    // row0 + c * ld (c < cols <= 16), elements [e0, e0 + 32 chunks) of each - those at or past k
    // are padding, +0 - into `chunks` tiles at out, what widen_b writes from the same chunks of
    // the packed strip; with `fold` ([chunks][32] addends, b_fold_add's for each chunk's group),
    // what widen_fold writes, in the same pass. Null where the set's window is not bf16 tiles
    // (gemm() then packs B).
    void (*widen_rows)(const uint8_t* row0, int64_t ld, int64_t cols, int64_t e0, int64_t chunks, int64_t k,
                       const ExpandTable& t, const int16_t* fold, void* out);
    const char* name;  // what gemm_kernels_name() reports: amx, avx512-bf16, avx2, portable
};

// The float32 matmul built with portable flags (src/cpu/matmul.cpp) and with AVX2 + FMA
// (src/cpu/gemm_avx2.cpp; the AMX tables use it too).
void matmul_f32_portable(float* c, const float* a, bool ta, const float* b, bool tb, int64_t m, int64_t n, int64_t k,
                         bool accumulate);
void matmul_f32_avx2(float* c, const float* a, bool ta, const float* b, bool tb, int64_t m, int64_t n, int64_t k,
                     bool accumulate);

namespace {  // compiled into each kernel TU with that TU's ISA flags (internal linkage, no ODR mixing)

// A K group's partial sums promoted, as a loop the compiler vectorizes: acc[r * ldacc + col] =
// part[r * 32 + col] * (sa[r * sa_stride] * sb_col) for the first group, then acc = fma(partial,
// sa * sb_col, acc) - DeepGEMM's order, the multiply-add rounded once - where column 16 t + c's
// scale sb_col is sb[t * sb_strip + c] (Promotion's layout).
// Fused explicitly: written `acc += partial * (sa * sb)`, GCC made it an FMA at -O3 and a multiply
// and an add at -O1 (the asan preset), so D depended on the optimisation level (the small-M
// kernels' bit-equality test with the tiles caught it). std::fma is one instruction in the kernel
// TUs (built with FMA), a libm call in the portable one.
inline void promote_loop(const float* part, int64_t rows, int64_t cols, const float* sa, int64_t sa_stride,
                         const float* sb, int64_t sb_strip, float* acc, int64_t ldacc, bool first) {
    for (int64_t r = 0; r < rows; ++r) {
        const float s = sa[r * sa_stride];
        for (int64_t c0 = 0; c0 < cols; c0 += gemm_tile) {
            float* out = acc + r * ldacc + c0;
            const float* p = part + r * 2 * gemm_tile + c0;
            const float* sbt = sb + c0 / gemm_tile * sb_strip;
            const int64_t n = std::min(gemm_tile, cols - c0);
            if (first) {
                for (int64_t c = 0; c < n; ++c) out[c] = p[c] * (s * sbt[c]);
            } else {
                for (int64_t c = 0; c < n; ++c) out[c] = std::fma(p[c], s * sbt[c], out[c]);
            }
        }
    }
}

// A K group's scales folded into its operands (gemm.cpp, "Folding"): a scale 2^e times an FP8 value
// in bf16 is that bf16 with e added to its exponent field - exact while the result stays a bf16
// normal. Every nonzero FP8 value of every format lies in [2^-17, 2^16) (e5m2fnuz's smallest
// subnormal to e5m2's largest finite); with |e| <= fold_max_log2 a folded value lies in [2^-49,
// 2^48], its products with another in [2^-98, 2^96] (float32 normals: the tiles flush nothing), and
// K <= 2^30 of them sum below 2^127.
inline constexpr int fold_max_log2 = 32;

// Whether a scale folds, and its exponent e (s = 2^e): positive, no mantissa bits, |e| <= fold_max_log2
// (0, NaN, Inf and negative scales do not).
inline bool fold_log2(float s, int& e) {
    const auto bits = std::bit_cast<uint32_t>(s);
    e = int(bits >> 23) - 127;
    return (bits & 0x807fffffu) == 0 && e >= -fold_max_log2 && e <= fold_max_log2;
}

// GemmKernels::fold as a loop the kernel TU vectorizes: x[i] += add[i % 32] where x[i] is a nonzero
// finite bf16 (zeros, Inf and NaN are what they were; FP8 values are never bf16 subnormals).
inline void fold_loop(uint16_t* x, int64_t n, const int16_t* add) {
    for (int64_t i = 0; i < n; i += 2 * gemm_tile) {
        for (int l = 0; l < 2 * gemm_tile; ++l) {
            const uint16_t v = x[i + l], mag = uint16_t(v & 0x7fffu);
            x[i + l] = mag != 0 && mag < 0x7f80u ? uint16_t(v + add[l]) : v;
        }
    }
}

// GemmKernels::widen_fold as the set's expand then fold_loop (which tests every lane: no specials).
template <void (*Expand)(const uint8_t*, int64_t, const ExpandTable&, uint16_t*)>
void widen_then_fold(const uint8_t* codes, int64_t n, const ExpandTable& t, bool, const int16_t* add, const uint8_t*,
                     uint16_t* out) {
    Expand(codes, n, t, out);
    fold_loop(out, n, add);
}

// The fold addends of B's strip s in K group g, for its widened tiles (lane 2 c + e of a 32-lane row
// holds column 16 s + c): each column's scale exponent in bf16's exponent field; 0 past n.
inline void b_fold_add(const PackedB& b, int64_t s, int64_t g, int16_t* add) {
    for (int64_t c = 0; c < gemm_tile; ++c) {
        const int64_t j = s * gemm_tile + c;
        int e = 0;
        if (j >= b.n || !fold_log2(b.sb(s, g)[c], e)) e = 0;
        add[2 * c] = add[2 * c + 1] = int16_t(e * 128);
    }
}

// GemmKernels::pack_group as loops: each K pair of the strip's rows is one 32-byte row of dst,
// written in order from a 2-byte read of each row (an odd length leaves the last pair's high byte
// as the caller's padding, 0).
inline void pack_group_loop(const uint8_t* row0, int64_t ld, int64_t cols, int64_t len, uint8_t* dst) {
    int64_t e = 0;
    for (; e + 1 < len; e += 2, dst += 2 * gemm_tile) {
        for (int64_t c = 0; c < cols; ++c) std::memcpy(dst + 2 * c, row0 + c * ld + e, 2);
    }
    if (e < len) {
        for (int64_t c = 0; c < cols; ++c) dst[2 * c] = row0[c * ld + e];
    }
}

// GemmKernels::mark_strip as one loop over the strip: a line's specials bit and the strip's
// nonfinite flag from each byte as it is read once.
template <Format F>
bool mark_strip_format(const uint8_t* strip, int64_t lines, uint8_t* specials) {
    uint8_t nonfinite = 0;
    for (int64_t line = 0; line < lines; ++line) {
        uint8_t special = 0;
        for (int e = 0; e < 64; ++e) {
            const uint8_t code = strip[64 * line + e];
            special |= uint8_t(!normal_code(code, F));
            nonfinite |= uint8_t(!finite_code(code, F));
        }
        specials[line / 8] |= uint8_t(special << (line % 8));
    }
    return nonfinite != 0;
}

inline bool mark_strip_loop(const uint8_t* strip, int64_t lines, Format f, uint8_t* specials) {
    return with_format(f, [&](auto format) { return mark_strip_format<decltype(format)::value>(strip, lines, specials); });
}

// GemmKernels::block for a kernel set whose Block does not promote: a K group's sums into a 32 x 32
// part, then promote_loop. One group a call (the set's block_groups is false).
template <void (*Block)(int, int, const uint16_t*, int64_t, const void*, int64_t, int64_t, float*, int64_t, bool)>
void block_then_promote(int rows, int nj, const uint16_t* a, int64_t lda, const void* b, int64_t b_strip, int64_t chunks,
                        float* c, int64_t ldc, bool accumulate, const Promotion* promotion) {
    if (promotion == nullptr) return Block(rows, nj, a, lda, b, b_strip, chunks, c, ldc, accumulate);
    alignas(64) float part[max_block_tiles * 2 * gemm_tile * gemm_tile];
    Block(rows, nj, a, lda, b, b_strip, chunks, part, 2 * gemm_tile, false);
    promote_loop(part, rows, nj * gemm_tile, promotion->sa, promotion->sa_stride, promotion->sb, promotion->sb_strip, c, ldc,
                 promotion->first);
}

// widen_b for the kernels whose window is bf16 tiles in the codes' order: their expand.
template <void (*Expand)(const uint8_t*, int64_t, const ExpandTable&, uint16_t*)>
void widen_bf16(const uint8_t* codes, int64_t n, const ExpandTable& t, bool, void* out) {
    Expand(codes, n, t, static_cast<uint16_t*>(out));
}

// begin / end for kernels that keep no per-thread state.
inline void no_tile_state() {}

// GELU of the GEMM epilogue (tanh form) on the host, as 0.5 x (1 + tanh z) = x / (1 + exp(-2z)),
// z = s (x + c x^3): one exp and one division, written for the kernel TUs to vectorize (no
// branch or select, no call, no float -> int conversion; every multiply-add an explicit fma, so
// that a TU built with FMA contracts nothing the baseline TU rounds twice: every path computes
// the same bits where fma is exact - the hardware's, glibc's fmaf; a kernel set's epilogues all
// take its TU's, GemmKernels::gelu_row). w = -2z = x (-2s - 2sc x^2), clamped to [-86, 88.8];
// n = w log2(e) rounded (by adding 1.5 * 2^23, whose low bits are then n), r = w - n ln2 by Cody
// and Waite's two constants (n ln2_hi exact, |r| <= ln2 / 2), exp(r) by its Taylor polynomial of
// degree 7 (the next term, (ln2 / 2)^8 / 8!, is 0.09 u), 2^n put in the exponent field.
// Ends: exp(-86) is a float32 normal, and 1 + exp(-86) rounds to 1 as 1 + exp(w) does below it.
// Above w = 88.38, n = 128 makes 2^n +Inf: the quotient is -0 where the true value is below
// |x| e^-88 (and -Inf / Inf = NaN for x = -Inf, as 0.5 x (1 + tanh z) = -Inf x 0). NaN stays NaN.
// Error against gelu(x) exactly, u = 2^-24, first order: w 4u (x^2, the fma, the two constants, the
// product); exp(r) 2u (truncation 0.09u, Horner's roundings 1.5u, r's rounding 0.35u, ln2's split
// 0.03u); 1 + exp one rounding, the quotient one. With g = sigmoid(-w), the result is off by
// g (1 - g)(4 |w| + 2) u + 2 g u of |x|: at most 2.85 u |x| (at w = -1.68).
// Checked against float64 by tests/ops/test_gemm.cpp (GemmOps.GeluEpilogueWithinItsBound).
inline float gelu_epilogue(float x) {
    constexpr float two_s = 1.59576917f, two_sc = 0.0713548139f;  // 2 sqrt(2 / pi), times 0.044715
    constexpr float log2e = 1.44269502f, round_add = 12582912.0f;  // 1.5 * 2^23
    constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194442e-4f;
    const float w = std::min(std::max(x * std::fma(x * x, -two_sc, -two_s), -86.0f), 88.8f);
    const float t = std::fma(w, log2e, round_add), n = t - round_add;
    const float r = std::fma(n, -ln2_lo, std::fma(n, -ln2_hi, w));
    float q = 1.98412701e-4f;  // 1 / 7!, then 1 / 6!, ..., 1 / 2!, 1, 1
    q = std::fma(q, r, 1.38888892e-3f);
    q = std::fma(q, r, 8.33333377e-3f);
    q = std::fma(q, r, 4.16666679e-2f);
    q = std::fma(q, r, 0.166666672f);
    q = std::fma(q, r, 0.5f);
    q = std::fma(q, r, 1.0f);
    q = std::fma(q, r, 1.0f);
    // 2^n from n's bits (in uint32: no overflow; n = 128 gives Inf's bits)
    const float two_n = std::bit_cast<float>((std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(round_add) + 127u) << 23);
    return x / std::fma(q, two_n, 1.0f);
}

// GemmKernels::scale_store as loops the kernel TU vectorizes: the products rounded as finish_rows
// rounds them, and a bf16 D rounded to nearest even with NaN kept quiet, fp8kit::bf16's rounding
// written out on the bits (so that no inline function is compiled with this TU's ISA; checked
// against it by test_gemm). With a bias the products are stored first and the bias added in a
// loop of its own: in one loop a TU built with FMA would fuse product and bias into one rounding.
// float32 -> bf16 bits as fp8kit::bf16 rounds: to nearest even, NaN kept quiet.
inline uint16_t bf16_round_bits(float x) {
    const auto b = std::bit_cast<uint32_t>(x);
    return (b & 0x7fffffffu) > 0x7f800000u ? uint16_t((b >> 16) | 0x40u) : uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// GemmKernels::gelu_row: v[j] = gelu_epilogue(v[j]), j < cols.
inline void gelu_row_loop(float* v, int64_t cols) noexcept {
    for (int64_t j = 0; j < cols; ++j) v[j] = gelu_epilogue(v[j]);
}

// v[j] = alpha * (v[j] * (sa * sb[j])), stored, then (GELU) v[j] = gelu_epilogue(v[j] (+ bias[j])).
inline void scale_values(float* v, float alpha, float sa, const float* sb, const float* bias, bool gelu, int64_t cols) {
    for (int64_t j = 0; j < cols; ++j) v[j] = alpha * (v[j] * (sa * sb[j]));
    if (gelu && bias != nullptr) {
        for (int64_t j = 0; j < cols; ++j) v[j] = gelu_epilogue(v[j] + bias[j]);
    } else if (gelu) {
        gelu_row_loop(v, cols);
    }
}

inline void scale_store_loop(float* v, float alpha, float sa, const float* sb, const float* bias, bool gelu, void* out,
                             bool bf16_out, int64_t cols) {
    if (bias != nullptr || gelu) scale_values(v, alpha, sa, sb, bias, gelu, cols);
    const auto d = [&](int64_t j) {
        return gelu ? v[j] : bias != nullptr ? v[j] + bias[j] : alpha * (v[j] * (sa * sb[j]));
    };
    if (!bf16_out) {
        float* o = static_cast<float*>(out);
        for (int64_t j = 0; j < cols; ++j) o[j] = d(j);
        return;
    }
    uint16_t* o = static_cast<uint16_t*>(out);
    for (int64_t j = 0; j < cols; ++j) o[j] = bf16_round_bits(d(j));
}

}  // namespace

// The widening and small-M kernel of src/cpu/gemm_avx512.cpp, which the AMX kernels share: built
// with AVX-512 flags, called only where avx512_gemm_kernels() is not null (AVX512-VBMI and -BF16).
// small_bf16<P>: a single row streams B as P says (src/cpu/gemm_avx512.cpp measures both).
void expand_vbmi(const uint8_t* codes, int64_t n, const ExpandTable& t, uint16_t* out);
void pack_group_avx512(const uint8_t* row0, int64_t ld, int64_t cols, int64_t len, uint8_t* dst);
bool mark_strip_avx512(const uint8_t* strip, int64_t lines, Format f, uint8_t* specials);
void widen_rows_vbmi(const uint8_t* row0, int64_t ld, int64_t cols, int64_t e0, int64_t chunks, int64_t k,
                     const ExpandTable& t, const int16_t* fold, void* out);
void fold_vbmi(uint16_t* x, int64_t n, const int16_t* add);
void widen_fold_vbmi(const uint8_t* codes, int64_t n, const ExpandTable& t, bool nan, const int16_t* add,
                     const uint8_t* specials, uint16_t* out);
void scale_store_avx512(float* v, float alpha, float sa, const float* sb, const float* bias, bool gelu, void* out,
                        bool bf16_out, int64_t cols);
// How the small-M kernel streams B for a single row (M = 1): strips at once, and how many chunks
// ahead in its thread's stream it prefetches each strip's lines into L1.
// arith: whether normal codes widen by shifts (widen_vbmi.hpp) instead of byte tables.
struct OneRowStream {
    int strips;
    int l1_ahead;
    bool arith;
};
inline constexpr OneRowStream avx512_one_row{1, 16, false};  // the avx512-bf16 set (Zen 4 and 5)
inline constexpr OneRowStream amx_one_row{2, 4, true};       // AMX CPUs (Sapphire Rapids)
template <OneRowStream P>
void small_bf16(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
                const float* sa, const ExpandTable& t, bool fold, float* acc, int64_t ldacc);

// On the avx512 path: AMX where it is usable, else AVX512-BF16 where the CPU has it (and VBMI);
// AVX2 on the avx2 path and on the avx512 path of CPUs with neither; else the portable kernels. The one ISA dispatch of the cpu backend's GEMM engine: the FP8 GEMM
// and the float32 matmul of the layer ops both take their kernels from here.
const GemmKernels& gemm_kernels();
const GemmKernels* amx_gemm_kernels();     // null where AMX cannot run (CPU, OS or build)
const GemmKernels* avx512_gemm_kernels();  // null without AVX512-BF16 and -VBMI (CPU or build)
const GemmKernels* avx2_gemm_kernels();  // null where the build has no x86 kernels
// The avx2 kernels' small-M kernel (src/cpu/gemm_avx2_small.cpp), a GemmKernels::small.
void small_avx2(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
                const float* sa, const ExpandTable& t, bool fold, float* acc, int64_t ldacc);

}  // namespace fp8kit::cpu
