// fp8kit/half.hpp: 16-bit storage types bf16 and f16, and the float32 rounding primitive that
// every narrowing conversion in fp8kit (f16, bf16 and all FP8 formats) is built on.
//
// Checked against: the hardware conversions (F16C vcvtps2ph / vcvtph2ps) over all 2^32 float32
// and all 2^16 half inputs in tests/ops/test_convert_exhaustive.cpp, and numpy's float16 / ml_dtypes' bfloat16
// through the golden tests.
//
// Everything here is constexpr and usable from host and device code. Rounding is done on the
// integer bits of the float32, never with float arithmetic that could depend on the caller's
// rounding mode or flush-to-zero setting.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "fp8kit/config.hpp"

namespace fp8kit {

namespace detail {

// std::bit_cast is host-only under nvcc (without --expt-relaxed-constexpr, which fp8kit does not
// ask of its users): a device function that reaches it is undefined, and nvcc's device pass drops
// the whole kernel body (seen: a kernel calling decode() compiled to a bare `ret`). So the device
// pass uses CUDA's reinterpretation intrinsics, always; host code and constant evaluation on the
// host keep std::bit_cast. (tests/cuda/test_format_device.cu checks every code on a GPU.)
FP8KIT_HD constexpr uint32_t f32_bits(float x) noexcept {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    return std::bit_cast<uint32_t>(x);
#endif
}
FP8KIT_HD constexpr float f32_from_bits(uint32_t b) noexcept {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    return std::bit_cast<float>(b);
#endif
}

inline constexpr uint32_t f32_sign_bit = 0x80000000u;
inline constexpr uint32_t f32_inf_bits = 0x7f800000u;
inline constexpr uint32_t f32_qnan_bits = 0x7fc00000u;

// Round a non-negative, non-NaN float32 (given as its bits `a`, sign cleared) to nearest-even in a
// binary format with `man_bits` mantissa bits, exponent bias `bias` and subnormals, and return the
// magnitude code (exponent field << man_bits | mantissa). The result is not range-checked: a
// value that rounds past the format's largest finite magnitude (or Inf) returns a code above it,
// and the caller applies its own overflow rule. One rounding, straight from the float32 bits.
FP8KIT_HD constexpr uint32_t round_magnitude(uint32_t a, int man_bits, int bias) noexcept {
    const uint32_t min_normal = uint32_t(127 + 1 - bias) << 23;  // bits of 2^(1-bias)
    if (a >= min_normal) {
        // Normal result: drop 23-man_bits mantissa bits with round-to-nearest-even (add half-1
        // plus the kept LSB, so exact halves go to even). A carry out of the mantissa correctly
        // bumps the exponent; then rebias the exponent field from 127 to `bias`.
        const int k = 23 - man_bits;
        const uint32_t lsb = (a >> k) & 1u;
        const uint32_t rounded = (a + ((1u << (k - 1)) - 1u) + lsb) >> k;
        return rounded - (uint32_t(127 - bias) << man_bits);
    }
    // Subnormal (or zero) result: the code is |x| / 2^(1-bias-man_bits) rounded to an integer.
    // With |x| = m * 2^(e-150) (m with its implicit bit), that is m >> k, k = 151-bias-man_bits-e.
    // k >= 24-man_bits >= 1 here. Rounding up out of the subnormal range yields the min normal
    // code (1 << man_bits), which is exactly its encoding.
    const uint32_t e = a >> 23;
    const uint32_t m = e != 0 ? (a & 0x7fffffu) | 0x800000u : a;
    const int k = 151 - bias - man_bits - int(e != 0 ? e : 1u);
    if (k >= 32) return 0;  // m < 2^24 <= half a quantum: rounds to zero
    const uint32_t lsb = (m >> k) & 1u;
    return (m + ((1u << (k - 1)) - 1u) + lsb) >> k;
}

}  // namespace detail

// bfloat16: 1 sign, 8 exponent, 7 mantissa bits. Storage type; convert to float to compute.
struct bf16 {
    uint16_t bits = 0;

    constexpr bf16() noexcept = default;
    // Round to nearest even; NaN stays NaN (quiet, sign kept); overflow gives Inf.
    FP8KIT_HD explicit constexpr bf16(float x) noexcept : bits(from_float(x)) {}
    FP8KIT_HD static constexpr bf16 from_bits(uint16_t b) noexcept {
        bf16 h;
        h.bits = b;
        return h;
    }
    // Exact: every bf16 is a float32 with the low 16 bits zero.
    FP8KIT_HD explicit constexpr operator float() const noexcept {
        return detail::f32_from_bits(uint32_t(bits) << 16);
    }

private:
    FP8KIT_HD static constexpr uint16_t from_float(float x) noexcept {
        const uint32_t b = detail::f32_bits(x);
        if ((b & 0x7fffffffu) > detail::f32_inf_bits) return uint16_t((b >> 16) | 0x40u);
        return uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
};

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits, with Inf and NaN.
struct f16 {
    uint16_t bits = 0;

    constexpr f16() noexcept = default;
    // Round to nearest even; |x| >= 65520 gives Inf; NaN stays NaN (quiet, sign kept).
    FP8KIT_HD explicit constexpr f16(float x) noexcept : bits(from_float(x)) {}
    FP8KIT_HD static constexpr f16 from_bits(uint16_t b) noexcept {
        f16 h;
        h.bits = b;
        return h;
    }
    // Exact: every binary16 value is a float32.
    FP8KIT_HD explicit constexpr operator float() const noexcept {
        const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
        const uint32_t exp = (bits >> 10) & 0x1fu;
        const uint32_t man = bits & 0x3ffu;
        if (exp == 0x1f) return detail::f32_from_bits(sign | detail::f32_inf_bits | (man << 13));
        if (exp == 0) {
            // Subnormal or zero: man * 2^-24, exact in float32 (and a float32 normal, so this
            // multiply is unaffected by flush-to-zero modes).
            const float v = float(man) * 0x1p-24f;
            return detail::f32_from_bits(sign | detail::f32_bits(v));
        }
        return detail::f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    }

private:
    FP8KIT_HD static constexpr uint16_t from_float(float x) noexcept {
        const uint32_t b = detail::f32_bits(x);
        const uint32_t sign = (b >> 16) & 0x8000u;
        const uint32_t a = b & 0x7fffffffu;
        if (a > detail::f32_inf_bits) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x1ffu));
        const uint32_t mag = detail::round_magnitude(a, 10, 15);
        return uint16_t(sign | (mag >= 0x7c00u ? 0x7c00u : mag));
    }
};

}  // namespace fp8kit
