// fp8kit/scaling.hpp: how FP8 data is scaled - the scaling granularities, and the scale
// arithmetic of docs/NUMERICS.md written once (constexpr, host and CUDA device) so that every
// backend computes bit-identical scales.
//
// Checked against: hand-derived cases for every rule (amax 0, NaN, Inf, subnormal, FLT_MAX,
// epsilon, power of two, MX exponents for every format) in tests/unit/test_scaling.cpp, and
// float64 arithmetic over random amax values there.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "fp8kit/config.hpp"
#include "fp8kit/format.hpp"

namespace fp8kit {

// Which elements share one scale. A tensor of any rank is scaled as the matrix
// [numel / last dim, last dim].
//  - tensor:      one scale for everything (TransformerEngine "current"/"delayed", torchao tensorwise)
//  - row:         one per row (torchao rowwise; for a weight [out, in], one per output channel)
//  - column:      one per column
//  - block{r, c}: one per r x c tile; tiles at the bottom and right edges are cut by the matrix
//                 (DeepSeek-V3 / DeepGEMM: 1x128 for activations, 128x128 for weights)
//  - mx32:        one e8m0 scale per 1x32 block (OCP Microscaling MXFP8)
enum class Granularity : uint8_t { tensor, row, column, block, mx32 };

struct GroupShape {
    int64_t rows, cols;
    bool operator==(const GroupShape&) const = default;
};

struct Scaling {
    Granularity granularity = Granularity::tensor;
    int64_t block_rows = 0, block_cols = 0;  // block only (>= 1)

    static constexpr Scaling tensor() noexcept { return {Granularity::tensor}; }
    static constexpr Scaling row() noexcept { return {Granularity::row}; }
    static constexpr Scaling column() noexcept { return {Granularity::column}; }
    static constexpr Scaling block(int64_t r, int64_t c) noexcept { return {Granularity::block, r, c}; }
    static constexpr Scaling mx32() noexcept { return {Granularity::mx32}; }

    // One group of a [rows, cols] matrix (before cutting at the edges), and the shape of the
    // scale tensor: [ceil(rows / group rows), ceil(cols / group cols)]. fp8kit::Error for a
    // block with a dimension < 1 or above max_block_dim.
    static constexpr int64_t max_block_dim = int64_t(1) << 31;
    GroupShape group_shape(int64_t rows, int64_t cols) const;
    GroupShape scale_shape(int64_t rows, int64_t cols) const;
    bool operator==(const Scaling&) const = default;
};

// "tensor", "row", "column", "block(1x128)", "mx32"; parse reads these and also "block:RxC".
std::string to_string(const Scaling& s);
Scaling parse_scaling(std::string_view text);  // fp8kit::Error naming the value

// ---- scale arithmetic (docs/NUMERICS.md, "Scales") ----

// TransformerEngine's formula: scale = fp8_max / amax in IEEE float32, with amax raised to
// amax_epsilon first; amax 0, NaN or Inf gives `fallback` (1 for current scaling, the previous
// scale for delayed scaling); a quotient that overflows gives FLT_MAX; power_of_two rounds the
// scale down to 2^k by clearing its mantissa, so multiplying by it is exact.
FP8KIT_HD constexpr float compute_scale(float amax, float fp8_max, float amax_epsilon = 0.0f,
                                        bool power_of_two = false, float fallback = 1.0f) noexcept {
    if (amax < amax_epsilon) amax = amax_epsilon;  // NaN compares false and stays NaN
    const uint32_t a = detail::f32_bits(amax) & 0x7fffffffu;
    if (a == 0 || a >= 0x7f800000u) return fallback;  // 0, Inf, NaN
    float scale = fp8_max / amax;
    if (detail::f32_bits(scale) == 0x7f800000u) scale = 0x1.fffffep127f;  // FLT_MAX
    if (power_of_two) scale = detail::f32_from_bits(detail::f32_bits(scale) & 0xff800000u);
    return scale;
}

// MX shared scales (OCP Microscaling v1.0). `floor` is the spec: X = 2^(floor(log2(amax)) -
// emax_elem), elements then encoded with saturation (values just under the next power of two
// clamp to max). `up` is TransformerEngine's choice: the smallest power of two with
// amax / X <= fp8_max, so nothing saturates.
enum class MxRounding : uint8_t { floor, up };

// emax_elem: the exponent of the format's largest normal (8 for e4m3fn, 15 for e5m2, 7 for
// e4m3fnuz, 15 for e5m2fnuz).
FP8KIT_HD constexpr int mx_emax(Format f) noexcept {
    const FormatInfo fi = format_info(f);
    return int(detail::f32_bits(fi.max) >> 23) - 127;
}

// The e8m0 code of X for a block with this amax (>= 0 or NaN). amax NaN or Inf: 0xff (NaN: the
// spec makes the whole block NaN). amax 0: 0x00 (2^-127; any scale represents zeros exactly).
// Exponents are clamped to e8m0's range [-127, 127].
FP8KIT_HD constexpr uint8_t mx_scale_code(float amax, Format f, MxRounding r) noexcept {
    uint32_t a = detail::f32_bits(amax) & 0x7fffffffu;
    if (a >= 0x7f800000u) return 0xff;
    if (a == 0) return 0x00;
    int log2_floor = int(a >> 23) - 127;
    if (a < 0x00800000u) {  // subnormal: normalise the significand
        log2_floor = -126;
        while (a < 0x00800000u) {
            a <<= 1;
            --log2_floor;
        }
    }
    int e = log2_floor - mx_emax(f);
    if (r == MxRounding::up) {
        // amax / 2^e = significand * 2^emax; it exceeds max exactly when the significand (in
        // [1, 2)) exceeds max / 2^emax.
        const float significand = detail::f32_from_bits((a & 0x007fffffu) | 0x3f800000u);
        const float limit = format_info(f).max / detail::f32_from_bits(uint32_t(127 + mx_emax(f)) << 23);
        if (significand > limit) ++e;
    }
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return uint8_t(e + 127);
}

// What quantize multiplies by for an e8m0 scale code: 1/X = 2^(127 - code) exactly (2^-127 is a
// float32 subnormal). The NaN code gives 1: elements of a NaN block are encoded unscaled (and
// decode to NaN through the NaN scale).
FP8KIT_HD constexpr float mx_quantize_multiplier(uint8_t code) noexcept {
    if (code == 0xff) return 1.0f;
    if (code == 0xfe) return 0x1p-127f;
    return detail::f32_from_bits(uint32_t(254 - code) << 23);
}

}  // namespace fp8kit
