// src/cpu/gemm_avx2.cpp: the GEMM kernels on AVX2 + FMA - every x86-64 CPU since 2013 (Haswell,
// Zen) and AVX-512 CPUs without AMX: the tiles, the codes' expansion, the layer ops' float32
// matmul and the kernel set (its small-M kernel is src/cpu/gemm_avx2_small.cpp, the decode they
// share src/cpu/pair_row_avx2.hpp). Built with -mavx2 -mfma; chosen at run time on the avx2 and
// avx512 paths when AMX cannot run. Checked against the reference backend and float64 by
// tests/ops/test_gemm.cpp (the avx2 and avx512 ISA paths).
//
// Why the same numbers as the tiles: every FP8 value is exact in bf16 and in float32, and a
// product of two of them is exact in float32, so fma(a, b, acc) = acc + a*b rounded once - the
// float32 addition of an exact product that TDPBF16PS and the portable kernel perform. The tile
// kernel adds each element's products in K order, as they do.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "cpu/gemm_kernels.hpp"
#include "cpu/matmul_kernel.hpp"
#include "cpu/pair_row_avx2.hpp"

namespace fp8kit::cpu {

namespace {

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
constexpr GemmKernels avx2_kernels{&expand_avx2, &widen_b_avx2, 4, 16, 4, 4, 0, 3, 0, &block_then_promote<&block_avx2>, false, &begin_avx2,
                                    &no_tile_state, &small_avx2, nullptr, 24, 24, 0, 0, &matmul_f32_avx2, &scale_store_loop, &gelu_row_loop, nullptr, nullptr, 0, &pack_group_loop, &mark_strip_loop, nullptr, "avx2"};
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
