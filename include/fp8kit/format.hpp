// fp8kit/format.hpp: the FP8 formats, their limits, and the scalar encode/decode every backend
// is built on (written once, constexpr, usable from host and CUDA device code).
//
// Checked against: ../shared/testdata/fp8_decode.tsv and fp8_encode.tsv (exact rational
// arithmetic from the OCP OFP8 rules) in tests/golden, and ml_dtypes over all 2^32 float32
// inputs in tests/golden/test_mldtypes. The rules are those of docs/NUMERICS.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "fp8kit/config.hpp"
#include "fp8kit/half.hpp"

namespace fp8kit {

enum class Format : uint8_t { e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu };
inline constexpr Format all_formats[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz,
                                         Format::e5m2fnuz, Format::e8m0fnu};

// What happens to a finite value that rounds above the format's largest finite magnitude, and
// to +-Inf: `saturate` clamps to +-max (CUDA __NV_SATFINITE, TransformerEngine, the MX spec);
// `nonsaturating` gives +-Inf where the format has it (e5m2) and NaN otherwise (ml_dtypes,
// PyTorch eager, __NV_NOSAT). NaN in gives NaN out in both.
enum class Overflow : uint8_t { saturate, nonsaturating };

struct FormatInfo {
    Format format;
    const char* name;    // plain C strings: usable in device code, unlike std::string_view
    int exponent_bits;
    int mantissa_bits;
    int bias;
    bool has_sign;       // e8m0fnu is unsigned
    bool has_inf;        // only e5m2
    bool has_neg_zero;   // e4m3fn, e5m2
    uint8_t max_code;    // largest finite magnitude code (sign bit clear)
    uint8_t nan_code;    // the NaN fp8kit produces (positive where the format has a sign)
    float max;           // largest finite value
    float min_normal;    // smallest positive normal
    float min_subnormal; // smallest positive value (equals min_normal when there are none)
    float epsilon;       // distance from 1.0 to the next larger value
    const char* nan_rule;  // human description, printed by `fp8kit formats`
};

FP8KIT_HD constexpr FormatInfo format_info(Format f) noexcept {
    switch (f) {
        case Format::e4m3fn:
            return {f, "e4m3fn", 4, 3, 7, true, false, true, 0x7e, 0x7f,
                    448.0f, 0x1p-6f, 0x1p-9f, 0x1p-3f, "S.1111.111 (0x7f, 0xff)"};
        case Format::e5m2:
            return {f, "e5m2", 5, 2, 15, true, true, true, 0x7b, 0x7e,
                    57344.0f, 0x1p-14f, 0x1p-16f, 0x1p-2f, "S.11111.xx, xx!=0 (0x7d-0x7f, 0xfd-0xff)"};
        case Format::e4m3fnuz:
            return {f, "e4m3fnuz", 4, 3, 8, true, false, false, 0x7f, 0x80,
                    240.0f, 0x1p-7f, 0x1p-10f, 0x1p-3f, "0x80 only"};
        case Format::e5m2fnuz:
            return {f, "e5m2fnuz", 5, 2, 16, true, false, false, 0x7f, 0x80,
                    57344.0f, 0x1p-15f, 0x1p-17f, 0x1p-2f, "0x80 only"};
        case Format::e8m0fnu:
            break;
    }
    return {Format::e8m0fnu, "e8m0fnu", 8, 0, 127, false, false, false, 0xfe, 0xff,
            0x1p127f, 0x1p-127f, 0x1p-127f, 1.0f, "0xff only"};
}

// Names: canonical `e4m3fn`, `e5m2`, `e4m3fnuz`, `e5m2fnuz`, `e8m0fnu`; aliases `e4m3` (e4m3fn),
// `e8m0` (e8m0fnu), and the ml_dtypes / PyTorch spellings `float8_e4m3fn` etc.
std::string_view to_string(Format f) noexcept;
std::string_view to_string(Overflow o) noexcept;  // "saturate", "nonsaturating"
std::optional<Format> try_parse_format(std::string_view name) noexcept;
Format parse_format(std::string_view name);        // throws fp8kit::Error naming the value
Overflow parse_overflow(std::string_view name);    // "saturate"/"sat", "nonsaturating"/"nosat"

// True for every NaN code of the format.
FP8KIT_HD constexpr bool is_nan(uint8_t code, Format f) noexcept {
    switch (f) {
        case Format::e4m3fn: return (code & 0x7f) == 0x7f;
        case Format::e5m2: return (code & 0x7f) > 0x7c;
        case Format::e4m3fnuz:
        case Format::e5m2fnuz: return code == 0x80;
        case Format::e8m0fnu: break;
    }
    return code == 0xff;
}

// ---- decode: exact, every code of every format is a float32 ----

FP8KIT_HD constexpr float decode(uint8_t code, Format f) noexcept {
    using namespace detail;
    const FormatInfo fi = format_info(f);
    if (is_nan(code, f)) {
        return f32_from_bits(f32_qnan_bits | (fi.has_sign ? uint32_t(code >> 7) << 31 : 0u));
    }
    if (f == Format::e8m0fnu) {
        // 2^(code-127); code 0 is 2^-127, a float32 subnormal.
        return f32_from_bits(code == 0 ? 0x00400000u : uint32_t(code) << 23);
    }
    const uint32_t sign = uint32_t(code >> 7) << 31;
    const uint32_t mag = code & 0x7fu;
    if (f == Format::e5m2 && mag == 0x7c) return f32_from_bits(sign | f32_inf_bits);
    const int m = fi.mantissa_bits;
    const uint32_t exp = mag >> m;
    const uint32_t man = mag & ((1u << m) - 1u);
    if (exp == 0) {
        // Subnormal: man * 2^(1-bias-m). Both factors and the product are float32 normals, so
        // the multiply is exact and unaffected by flush-to-zero.
        const float quantum = f32_from_bits(uint32_t(127 + 1 - fi.bias - m) << 23);
        return f32_from_bits(sign | f32_bits(float(man) * quantum));
    }
    return f32_from_bits(sign | ((exp + uint32_t(127 - fi.bias)) << 23) | (man << (23 - m)));
}

// ---- encode: float32 -> FP8, round to nearest even, one rounding from the float32 ----

namespace detail {

// e8m0fnu (an exponent; no sign, no zero): follows ml_dtypes. Zero, negatives and NaN give NaN
// (nothing to round to: turning a zero scale into 2^-127 would hide it). A value exactly between
// 2^k and 2^(k+1) (1.5 * 2^k) rounds up; (0, 2^-127] gives 2^-127.
FP8KIT_HD constexpr uint8_t encode_e8m0(uint32_t b, Overflow o) noexcept {
    const uint32_t a = b & 0x7fffffffu;
    if ((b & f32_sign_bit) != 0 || a == 0 || a > f32_inf_bits) return 0xff;
    uint32_t code;
    if ((a >> 23) == 0) {
        code = a >= 0x600000u ? 1u : 0u;  // float32 subnormal: 2^-127 is 0x400000
    } else {
        code = (a + 0x400000u) >> 23;     // round half up on the exponent
    }
    if (code > 0xfe) return o == Overflow::saturate ? 0xfe : 0xff;
    return uint8_t(code);
}

// Apply overflow rule and sign to a magnitude code from round_magnitude().
FP8KIT_HD constexpr uint8_t finish_code(uint32_t mag, uint32_t sign, Format f, Overflow o) noexcept {
    const FormatInfo fi = format_info(f);
    if (mag > fi.max_code) {
        if (o == Overflow::saturate) {
            mag = fi.max_code;
        } else if (fi.has_inf) {
            return uint8_t((sign << 7) | 0x7c);
        } else {
            return fi.has_neg_zero ? uint8_t((sign << 7) | fi.nan_code) : fi.nan_code;
        }
    }
    if (mag == 0 && !fi.has_neg_zero) return 0;  // fnuz: no -0, negatives rounding to 0 give 0x00
    return uint8_t((sign << 7) | mag);
}

// What encode() and encode_stochastic() share: e8m0fnu, NaN, then `round` (a functor taking the
// magnitude bits and the FormatInfo, returning the magnitude code), then overflow and sign. +-Inf
// needs no case of its own: every rounding puts it above max_code, so the overflow rule applies.
template <class Rounding>
FP8KIT_HD constexpr uint8_t encode_with(float x, Format f, Overflow o, Rounding round) noexcept {
    const uint32_t b = f32_bits(x);
    if (f == Format::e8m0fnu) return encode_e8m0(b, o);
    const FormatInfo fi = format_info(f);
    const uint32_t sign = b >> 31;
    const uint32_t a = b & 0x7fffffffu;
    if (a > f32_inf_bits) return fi.has_neg_zero ? uint8_t((sign << 7) | fi.nan_code) : fi.nan_code;
    return finish_code(round(a, fi), sign, f, o);
}

struct NearestEven {
    FP8KIT_HD constexpr uint32_t operator()(uint32_t a, const FormatInfo& fi) const noexcept {
        return round_magnitude(a, fi.mantissa_bits, fi.bias);
    }
};

// Round the magnitude up with probability equal to its fractional distance to the next code.
struct Stochastic {
    uint32_t random;
    FP8KIT_HD constexpr uint32_t operator()(uint32_t a, const FormatInfo& fi) const noexcept {
        const int man = fi.mantissa_bits;
        if (a >= uint32_t(127 + 1 - fi.bias) << 23) {
            // The k dropped bits are exactly the fraction in units of 2^-k quanta: adding k
            // uniform random bits carries into the kept part with probability = fraction.
            const int k = 23 - man;
            return ((a + (random >> (32 - k))) >> k) - (uint32_t(127 - fi.bias) << man);
        }
        // Subnormal result: |x| / quantum as 32.32 fixed point (exact while the shift keeps all
        // of m), plus a uniform 32-bit fraction.
        const uint32_t e = a >> 23;
        const uint64_t m = e != 0 ? (a & 0x7fffffu) | 0x800000u : a;
        const int k = 151 - fi.bias - man - int(e != 0 ? e : 1u);
        const uint64_t fixed = k >= 56 ? 0 : (m << 32) >> k;
        return uint32_t((fixed + random) >> 32);
    }
};

}  // namespace detail

FP8KIT_HD constexpr uint8_t encode(float x, Format f, Overflow o = Overflow::saturate) noexcept {
    return detail::encode_with(x, f, o, detail::NearestEven{});
}

// From 16-bit inputs: the widening to float32 is exact, so this is still one rounding.
FP8KIT_HD constexpr uint8_t encode(bf16 x, Format f, Overflow o = Overflow::saturate) noexcept {
    return encode(float(x), f, o);
}
FP8KIT_HD constexpr uint8_t encode(f16 x, Format f, Overflow o = Overflow::saturate) noexcept {
    return encode(float(x), f, o);
}

// To 16-bit outputs. Every e4m3fn/e5m2/fnuz value is exact in bf16 and f16, and every e8m0fnu
// value is exact in bf16; e8m0fnu values outside f16's range become Inf or 0 (IEEE rounding).
FP8KIT_HD constexpr bf16 decode_bf16(uint8_t code, Format f) noexcept { return bf16(decode(code, f)); }
FP8KIT_HD constexpr f16 decode_f16(uint8_t code, Format f) noexcept { return f16(decode(code, f)); }

// ---- stochastic rounding ----

// Counter-based random bits: the same (seed, index) always gives the same 32 bits, on any
// backend and thread count. SplitMix64's finalizer on a seed-mixed Weyl sequence.
FP8KIT_HD constexpr uint32_t random_bits(uint64_t seed, uint64_t index) noexcept {
    auto mix = [](uint64_t z) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    };
    return uint32_t(mix(mix(seed) + (index + 1) * 0x9e3779b97f4a7c15ull) >> 32);
}

// Round |x| up to the next representable magnitude with probability equal to its fractional
// distance from the one below, using 32 random bits (exact for every float32 input whose
// distance to the grid is resolvable in 32 bits, i.e. all but values below 2^-32 of the
// smallest subnormal, which round up with probability truncated to a multiple of 2^-32).
// Overflow, NaN and sign follow encode(). e8m0fnu is not supported (returns encode()).
FP8KIT_HD constexpr uint8_t encode_stochastic(float x, Format f, uint32_t random,
                                              Overflow o = Overflow::saturate) noexcept {
    return detail::encode_with(x, f, o, detail::Stochastic{random});
}

}  // namespace fp8kit
