// src/cpu/gemm_amx.cpp: the GEMM kernels on Intel AMX (TDPBF16PS on 16x16 float32 tiles) and
// AVX-512 VBMI (byte-table FP8 -> bf16 widening), and for M <= 2 AVX512-BF16 (VDPBF16PS on
// codes widened in registers). Built with -mamx-tile -mamx-bf16 -mavx512*; used only when cpuid reports AMX-TILE, AMX-BF16 and AVX512-VBMI, XCR0 has the tile state, and
// (Linux) the kernel grants this process the tile data state. Checked against the reference
// backend by tests/ops/test_gemm.cpp (the avx512 ISA path on an AMX machine).
#include <immintrin.h>

#include <cpuid.h>

#include <bit>
#include <cstring>

#include "cpu/gemm_kernels.hpp"
#include "platform/platform.hpp"

namespace fp8kit::cpu {

namespace {

// ---- widening: 64 codes per step, four 128-entry byte lookups (VPERMI2B) ----
// The low and high bytes of each bf16 are looked up separately and interleaved with
// VPUNPCK[LH]BW, which works within 128-bit lanes; the codes are first permuted so that the
// interleaved words come out in order.
struct Widen {
    __m512i perm, lo[4], hi[4];
    explicit Widen(const ExpandTable& t) {
        alignas(64) static const uint8_t order[64] = {
            0,  1,  2,  3,  4,  5,  6,  7,  32, 33, 34, 35, 36, 37, 38, 39, 8,  9,  10, 11, 12, 13,
            14, 15, 40, 41, 42, 43, 44, 45, 46, 47, 16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51,
            52, 53, 54, 55, 24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63};
        perm = _mm512_load_si512(order);
        for (int i = 0; i < 4; ++i) {
            lo[i] = _mm512_load_si512(t.lo + 64 * i);
            hi[i] = _mm512_load_si512(t.hi + 64 * i);
        }
    }
    // bf16 of codes[0..32) into w0, of codes[32..64) into w1.
    void operator()(const uint8_t* codes, __m512i& w0, __m512i& w1) const {
        const __m512i x = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(codes));
        const __mmask64 upper = _mm512_movepi8_mask(x);  // codes >= 128
        const __m512i l = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(lo[0], x, lo[1]),
                                                 _mm512_permutex2var_epi8(lo[2], x, lo[3]));
        const __m512i h = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(hi[0], x, hi[1]),
                                                 _mm512_permutex2var_epi8(hi[2], x, hi[3]));
        w0 = _mm512_unpacklo_epi8(l, h);
        w1 = _mm512_unpackhi_epi8(l, h);
    }
};

void expand_vbmi(const uint8_t* codes, int64_t n, const ExpandTable& t, uint16_t* out) {
    const Widen widen(t);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i w0, w1;
        widen(codes + i, w0, w1);
        _mm512_storeu_si512(out + i, w0);
        _mm512_storeu_si512(out + i + 32, w1);
    }
    for (; i < n; ++i) out[i] = t.bf16[codes[i]];
}

// ---- small M: AVX512-BF16 dot products of bf16 pairs on codes widened in registers ----
// A 64-code line of a packed strip holds two K pairs p, p + 1 for the strip's 16 columns (byte
// 32 p + 2 c + e); widened, each is 16 lanes of (B[c, 2p], B[c, 2p + 1]), and VDPBF16PS adds
// A[r, 2p] B[c, 2p] + A[r, 2p + 1] B[c, 2p + 1] to lane c with the A pair broadcast. Two
// accumulators per row (even and odd lines) halve the dependency chain. VDPBF16PS flushes
// subnormal products to zero; a product of two FP8 values as bf16 is never subnormal in float32
// (the smallest, 2^-16 * 2^-9, is 2^-25).
template <int R>
void small_rows(const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1, const float* sa,
                const ExpandTable& t, float* acc, int64_t ldacc) {
    const KLayout& kl = b.kl;
    const int64_t cpg = kl.chunks_per_group();
    const bool one_group = kl.groups == 1;
    const Widen widen(t);
    for (int64_t s = s0; s < s1; ++s) {
        const uint8_t* codes = b.strip(s);
        __m512 total[R];
        for (int64_t g = 0; g < kl.groups; ++g) {
            __m512 even[R], odd[R];
            for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
            for (int64_t q = g * cpg; q < (g + 1) * cpg; ++q) {
                const uint8_t* chunk = codes + q * gemm_chunk_codes;
                for (int l = 0; l < gemm_chunk_codes / 64; ++l) {
                    __m512i w0, w1;
                    widen(chunk + 64 * l, w0, w1);
                    for (int r = 0; r < R; ++r) {
                        const uint16_t* ap = a + r * lda + q * gemm_chunk + 4 * l;  // K pairs 2l, 2l + 1
                        int32_t p0, p1;
                        std::memcpy(&p0, ap, 4);
                        std::memcpy(&p1, ap + 2, 4);
                        even[r] = _mm512_dpbf16_ps(even[r], std::bit_cast<__m512bh>(_mm512_set1_epi32(p0)),
                                                   std::bit_cast<__m512bh>(w0));
                        odd[r] = _mm512_dpbf16_ps(odd[r], std::bit_cast<__m512bh>(_mm512_set1_epi32(p1)),
                                                  std::bit_cast<__m512bh>(w1));
                    }
                }
            }
            const __m512 sb = _mm512_loadu_ps(b.scales.data() + g * b.strips * gemm_tile + s * gemm_tile);
            for (int r = 0; r < R; ++r) {
                const __m512 part = _mm512_add_ps(even[r], odd[r]);
                if (one_group) {
                    total[r] = part;  // scaled in the epilogue
                } else {
                    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(sa[r * kl.groups + g]), sb);
                    total[r] = g == 0 ? _mm512_mul_ps(part, scale) : _mm512_fmadd_ps(part, scale, total[r]);
                }
            }
        }
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * ldacc + (s - s0) * gemm_tile, total[r]);
    }
}

void small_dispatch(int64_t rows, const uint16_t* a, int64_t lda, const PackedB& b, int64_t s0, int64_t s1,
                    const float* sa, const ExpandTable& t, float* acc, int64_t ldacc) {
    if (rows == 1) return small_rows<1>(a, lda, b, s0, s1, sa, t, acc, ldacc);
    small_rows<2>(a, lda, b, s0, s1, sa, t, acc, ldacc);
}

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

template <int MI, int NJ>
void block_amx(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t b_strip, int64_t chunks, float* c,
               int64_t ldc, bool accumulate) {
    const int64_t sa = lda * 2, sc = ldc * 4;
    const uint16_t* a1 = a + gemm_tile * lda;
    const uint16_t* b1 = b + b_strip;
    float* c1 = c + gemm_tile * ldc;
    if (accumulate) {
        _tile_loadd(0, c, sc);
        if constexpr (NJ > 1) _tile_loadd(1, c + gemm_tile, sc);
        if constexpr (MI > 1) _tile_loadd(2, c1, sc);
        if constexpr (MI > 1 && NJ > 1) _tile_loadd(3, c1 + gemm_tile, sc);
    } else {
        _tile_zero(0);
        if constexpr (NJ > 1) _tile_zero(1);
        if constexpr (MI > 1) _tile_zero(2);
        if constexpr (MI > 1 && NJ > 1) _tile_zero(3);
    }
    for (int64_t q = 0; q < chunks; ++q) {
        _tile_loadd(4, a + q * gemm_chunk, sa);
        _tile_loadd(6, b + q * gemm_chunk_codes, 64);
        if constexpr (NJ > 1) _tile_loadd(7, b1 + q * gemm_chunk_codes, 64);
        if constexpr (MI > 1) _tile_loadd(5, a1 + q * gemm_chunk, sa);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (NJ > 1) _tile_dpbf16ps(1, 4, 7);
        if constexpr (MI > 1) _tile_dpbf16ps(2, 5, 6);
        if constexpr (MI > 1 && NJ > 1) _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, sc);
    if constexpr (NJ > 1) _tile_stored(1, c + gemm_tile, sc);
    if constexpr (MI > 1) _tile_stored(2, c1, sc);
    if constexpr (MI > 1 && NJ > 1) _tile_stored(3, c1 + gemm_tile, sc);
}

void block_dispatch(int mi, int nj, const uint16_t* a, int64_t lda, const void* bw, int64_t b_strip,
                    int64_t chunks, float* c, int64_t ldc, bool accumulate) {
    const auto* b = static_cast<const uint16_t*>(bw);
    if (mi == 2 && nj == 2) return block_amx<2, 2>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
    if (mi == 2) return block_amx<2, 1>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
    if (nj == 2) return block_amx<1, 2>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
    block_amx<1, 1>(a, lda, b, b_strip, chunks, c, ldc, accumulate);
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

// cpuid leaf 7 subleaf 1: EAX 5 AVX512-BF16 (VDPBF16PS), for the small-M kernel.
bool avx512_bf16() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 5) & 1u);
}

// The small-M kernel for M <= 2: each row costs it two VDPBF16PS per 64 codes on top of the
// widening, so past 2 rows the tiles win even with their widened copy of B (measured with
// bench_gemm on a Xeon with AMX: M = 3 and 4 ran 20% and 60% slower than on the tiles).
constexpr int64_t amx_small_m_max = 2;
// The float32 matmul of the layer ops is AVX2's (no AMX tile computes in float32).
constexpr GemmKernels amx_kernels{&expand_vbmi, &widen_bf16<&expand_vbmi>, 2, &block_dispatch, &promote_loop,
                                  &amx_begin, &amx_end, nullptr, 0, &matmul_f32_avx2};
constexpr GemmKernels amx_bf16_kernels{&expand_vbmi, &widen_bf16<&expand_vbmi>, 2, &block_dispatch, &promote_loop,
                                       &amx_begin, &amx_end, &small_dispatch, amx_small_m_max, &matmul_f32_avx2};

}  // namespace

const GemmKernels* amx_gemm_kernels() {
    static const GemmKernels* kernels = !amx_usable() ? nullptr : avx512_bf16() ? &amx_bf16_kernels : &amx_kernels;
    return kernels;
}

}  // namespace fp8kit::cpu
