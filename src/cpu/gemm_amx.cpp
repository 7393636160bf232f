// src/cpu/gemm_amx.cpp: the GEMM kernels on Intel AMX (TDPBF16PS on 16x16 float32 tiles), with
// src/cpu/gemm_avx512.cpp's AVX-512 VBMI widening (FP8 -> bf16 byte tables) and, where the CPU has
// AVX512-BF16, its small-M kernel for M <= 2. Built with -mamx-tile -mamx-bf16 -mavx512*; used
// only when cpuid reports AMX-TILE, AMX-BF16 and AVX512-VBMI, XCR0 has the tile state, and
// (Linux) the kernel grants this process the tile data state. Checked against the reference
// backend by tests/ops/test_gemm.cpp (the avx512 ISA path on an AMX machine).
#include <immintrin.h>

#include <cpuid.h>

#include "cpu/gemm_kernels.hpp"
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

void block_dispatch(int rows, int nj, const uint16_t* a, int64_t lda, const void* bw, int64_t b_strip,
                    int64_t chunks, float* c, int64_t ldc, bool accumulate) {
    const auto* b = static_cast<const uint16_t*>(bw);
    const int64_t mi = (rows + gemm_tile - 1) / gemm_tile;
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

// The float32 matmul of the layer ops is AVX2's (no AMX tile computes in float32).
// A window of 64 chunks (2048 of K, 512 KiB of bf16 B for 8 strips: a quarter of a Sapphire Rapids
// core's 2 MiB L2): each block loads and stores its four C tiles once per window, and with 32 chunks
// that traffic held the tiles back. 2 threads, e4m3 tensorwise, in cache, best of 3-10 calls, two
// runs each (2026-11-25): 2048^3 1544-1663 GFLOP/s with 32, 2033-2091 with 64, 1936-2014 with 128;
// 2048 x 4096 x 4096 1598-1698 / 2007-2063 / 1453-1485; M = 128 1568-1640 / 1764-1847 / 1810-1822;
// 8 and 16 chunks slower than 32 (2048^3: 1244, 1395).
constexpr GemmKernels amx_kernels{&expand_vbmi, &widen_bf16<&expand_vbmi>, 2, 8, 64, 2, &block_then_promote<&block_dispatch>,
                                  &amx_begin, &amx_end, nullptr, 0, &matmul_f32_avx2, "amx"};
// With AVX512-BF16, M <= 2 runs src/cpu/gemm_avx512.cpp's small kernel: each row costs it two
// VDPBF16PS per 64 codes on top of the widening, so past 2 rows the tiles win even with their
// widened copy of B (measured with bench_gemm on a Xeon with AMX: M = 3 and 4 ran 20% and 60%
// slower than on the tiles). A single row streams two strips at once (gemm_avx512.cpp,
// small_strips_for).
constexpr GemmKernels amx_bf16_kernels{&expand_vbmi, &widen_bf16<&expand_vbmi>, 2, 8, 64, 2,
                                       &block_then_promote<&block_dispatch>, &amx_begin, &amx_end, &small_bf16<2>, 2,
                                       &matmul_f32_avx2, "amx"};

}  // namespace

const GemmKernels* amx_gemm_kernels() {
    static const GemmKernels* kernels = !amx_usable()                  ? nullptr
                                        : avx512_gemm_kernels() != nullptr ? &amx_bf16_kernels
                                                                           : &amx_kernels;
    return kernels;
}

}  // namespace fp8kit::cpu
