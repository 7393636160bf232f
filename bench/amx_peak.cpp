// bench/amx_peak.cpp: chains of Intel AMX bf16 tile products (TDPBF16PS), the arithmetic of
// fp8kit's amx GEMM kernels and of oneDNN's AMX bf16 matmul, for the tile peak bench_gemm reports
// their rates against (amx_bf16_peak, bench/fma_peak.cpp). Built, with the tile flags, only where
// the library builds its AMX kernels (CMakeLists.txt: FP8KIT_AMX_KERNELS), and called only where
// fp8kit chose them - so the CPU has the tiles and the OS granted this process their state.
//
// Four C tiles (a 2x2 block of 16 x 16 float32, as the kernels') each take one A and one B tile
// an iteration: four independent products of 16 x 16 x 32 pairs, which keep the tile unit busy
// through a product's latency. The operands stay in tile registers (no loads): this is the unit's
// rate, which a GEMM reaches only with its operands in L1. Every A and B element is 2^-8, exact in
// bf16, so each product adds 32 x 2^-16 = 2^-11 to each C element: normal, and exact as it sums.
#include <immintrin.h>

#include <cstdint>

#include "common.hpp"

namespace fp8kit::bench {

namespace {

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// All eight tiles 16 rows x 64 bytes: 0-3 C (float32), 4-5 A, 6-7 B (bf16 pairs).
constexpr TileConfig tile_config() {
    TileConfig c;
    for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
    return c;
}
alignas(64) constexpr TileConfig config = tile_config();

}  // namespace

float amx_chains(long long n) {
    alignas(64) uint16_t operand[16 * 32];
    for (uint16_t& v : operand) v = 0x3b80;  // bf16 2^-8
    alignas(64) float c[16 * 16];
    _tile_loadconfig(&config);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, operand, 64);
    _tile_loadd(5, operand, 64);
    _tile_loadd(6, operand, 64);
    _tile_loadd(7, operand, 64);
    for (long long i = 0; i < n; ++i) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float sum = 0.0f;
    _tile_stored(0, c, 64);
    sum += c[0];
    _tile_stored(1, c, 64);
    sum += c[0];
    _tile_stored(2, c, 64);
    sum += c[0];
    _tile_stored(3, c, 64);
    sum += c[255];
    _tile_release();
    return sum;
}

}  // namespace fp8kit::bench
