// tests/unit/test_format.cpp: the scalar formats - names, limits, the overflow thresholds of
// NUMERICS.md, the double-rounding trap, NaN/-0 rules, and every code's round trip. Expected values
// come from NUMERICS.md and exact powers of two, not from the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "fp8kit/dtype.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/scaling.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

constexpr Overflow sat = Overflow::saturate, nosat = Overflow::nonsaturating;

// Usable in constant expressions (and so on the device): evaluated by the compiler here.
static_assert(encode(1.0f, Format::e4m3fn) == 0x38);
static_assert(decode(0x7e, Format::e4m3fn) == 448.0f);
static_assert(encode(bf16(1.0f), Format::e5m2) == 0x3c);
static_assert(decode_bf16(0x3c, Format::e5m2).bits == 0x3f80);
static_assert(f16(0.1f).bits == 0x2e66);

TEST(FormatNames, CanonicalAliasesAndErrors) {
    for (Format f : all_formats) EXPECT_EQ(parse_format(to_string(f)), f);
    EXPECT_EQ(parse_format("e4m3"), Format::e4m3fn);
    EXPECT_EQ(parse_format("e8m0"), Format::e8m0fnu);
    EXPECT_EQ(parse_format("float8_e5m2fnuz"), Format::e5m2fnuz);
    EXPECT_FALSE(try_parse_format("E4M3").has_value());
    try {
        parse_format("e3m4");
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'e3m4'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("e4m3fn"), std::string::npos) << e.what();
    }
    EXPECT_EQ(parse_overflow("sat"), sat);
    EXPECT_EQ(parse_overflow("nonsaturating"), nosat);
    EXPECT_THROW(parse_overflow("clamp"), Error);
}

// A name the parsers refuse may come from a file or a Python caller: the message shows it through
// quote_printable - its escape sequence as text, a megabyte name as its first 200 bytes and its
// length - never raw (an ESC in the message would act on the terminal it is printed to).
TEST(FormatNames, RefusedNamesAreShownAsText) {
    const std::string esc = "e4\x1b[2J", huge = std::string(1 << 20, 'n');
    const std::function<void(const std::string&)> parsers[] = {
        [](const std::string& n) { (void)parse_format(n); }, [](const std::string& n) { (void)parse_overflow(n); },
        [](const std::string& n) { (void)parse_dtype(n); }, [](const std::string& n) { (void)parse_scaling(n); },
        [](const std::string& n) { (void)parse_recipe(n); }};
    for (size_t i = 0; i < std::size(parsers); ++i) {
        for (const std::string& name : {esc, huge}) {
            try {
                parsers[i](name);
                ADD_FAILURE() << "parser " << i << " took the name";
            } catch (const Error& e) {
                const std::string m = e.what();
                EXPECT_EQ(m.find('\x1b'), std::string::npos) << "parser " << i << ": " << m;
                EXPECT_LT(m.size(), 500u) << "parser " << i;
                const std::string shown = name == esc ? "'e4\\x1b[2J'" : "'" + std::string(200, 'n') + "'... (1048576 bytes)";
                EXPECT_NE(m.find(shown), std::string::npos) << "parser " << i << ": " << m.substr(0, 300);
            }
        }
    }
}

// The FormatInfo table against NUMERICS.md's table and against decode of the extreme codes.
TEST(FormatInfo, LimitsMatchNumericsTableAndDecode) {
    struct Want {
        Format f;
        int e, m, bias;
        float max, min_normal, min_sub;
    };
    const Want want[] = {
        {Format::e4m3fn, 4, 3, 7, 448.0f, std::ldexp(1.0f, -6), std::ldexp(1.0f, -9)},
        {Format::e5m2, 5, 2, 15, 57344.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -16)},
        {Format::e4m3fnuz, 4, 3, 8, 240.0f, std::ldexp(1.0f, -7), std::ldexp(1.0f, -10)},
        {Format::e5m2fnuz, 5, 2, 16, 57344.0f, std::ldexp(1.0f, -15), std::ldexp(1.0f, -17)},
        {Format::e8m0fnu, 8, 0, 127, std::ldexp(1.0f, 127), std::ldexp(1.0f, -127), std::ldexp(1.0f, -127)},
    };
    for (const Want& w : want) {
        const FormatInfo fi = format_info(w.f);
        SCOPED_TRACE(std::string(fi.name));
        EXPECT_EQ(fi.exponent_bits, w.e);
        EXPECT_EQ(fi.mantissa_bits, w.m);
        EXPECT_EQ(fi.bias, w.bias);
        EXPECT_EQ(fi.max, w.max);
        EXPECT_EQ(fi.min_normal, w.min_normal);
        EXPECT_EQ(fi.min_subnormal, w.min_sub);
        EXPECT_EQ(fi.epsilon, std::ldexp(1.0f, -w.m));
        EXPECT_EQ(decode(fi.max_code, w.f), w.max);
        EXPECT_TRUE(is_nan(fi.nan_code, w.f));
        // max is the largest finite value: every finite code decodes to at most it.
        for (int c = 0; c < 256; ++c) {
            const float v = decode(uint8_t(c), w.f);
            if (std::isfinite(v)) {
                EXPECT_LE(std::fabs(v), w.max);
            }
            if (v != 0 && std::isfinite(v)) {
                EXPECT_GE(std::fabs(v), w.min_sub);
            }
        }
    }
}

// Rounding through f16 first turns 1 + 2^-4 + 2^-23 into 1 + 2^-4 (a tie), which then rounds to
// even (1.0); rounding once from float32 sees it is above the tie and gives 1.125.
TEST(Encode, SingleRoundingNotThroughF16) {
    const float x = 1.0f + std::ldexp(1.0f, -4) + std::ldexp(1.0f, -23);
    EXPECT_EQ(decode(encode(x, Format::e4m3fn), Format::e4m3fn), 1.125f);
    EXPECT_EQ(float(f16(x)), 1.0625f);  // the trap really is there
    EXPECT_EQ(decode(encode(f16(x), Format::e4m3fn), Format::e4m3fn), 1.0f);
    // The same for bf16 inputs that carry the extra bit: bf16 -> float32 is exact, one rounding.
    const float y = 1.0f + std::ldexp(1.0f, -4) + std::ldexp(1.0f, -7);
    EXPECT_EQ(decode(encode(bf16(y), Format::e4m3fn), Format::e4m3fn), 1.125f);
}

TEST(Encode, OverflowThresholdsFromNumerics) {
    const float below_464 = std::nextafter(464.0f, 0.0f), above_464 = std::nextafter(464.0f, 1e9f);
    EXPECT_EQ(encode(464.0f, Format::e4m3fn, nosat), 0x7e);  // ties to 448 (even)
    EXPECT_EQ(encode(below_464, Format::e4m3fn, nosat), 0x7e);
    EXPECT_TRUE(is_nan(encode(above_464, Format::e4m3fn, nosat), Format::e4m3fn));
    EXPECT_EQ(encode(-above_464, Format::e4m3fn, sat), 0xfe);
    EXPECT_EQ(encode(std::nextafter(61440.0f, 0.0f), Format::e5m2, nosat), 0x7b);
    EXPECT_EQ(encode(61440.0f, Format::e5m2, nosat), 0x7c);   // +Inf
    EXPECT_EQ(encode(-61440.0f, Format::e5m2, nosat), 0xfc);  // -Inf
    EXPECT_EQ(encode(61440.0f, Format::e5m2, sat), 0x7b);
    EXPECT_EQ(encode(std::nextafter(248.0f, 0.0f), Format::e4m3fnuz, nosat), 0x7f);
    EXPECT_EQ(encode(248.0f, Format::e4m3fnuz, nosat), 0x80);  // the only NaN
    EXPECT_EQ(encode(248.0f, Format::e4m3fnuz, sat), 0x7f);
}

TEST(Encode, InfNanAndSignedZero) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (Format f : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
        const FormatInfo fi = format_info(f);
        SCOPED_TRACE(std::string(fi.name));
        EXPECT_EQ(encode(inf, f, sat), fi.max_code);
        EXPECT_EQ(encode(-inf, f, sat), 0x80 | fi.max_code);
        EXPECT_EQ(is_nan(encode(inf, f, nosat), f), !fi.has_inf);
        for (Overflow o : {sat, nosat}) {
            EXPECT_TRUE(is_nan(encode(nan, f, o), f));
            EXPECT_TRUE(is_nan(encode(-nan, f, o), f));
            EXPECT_EQ(encode(-0.0f, f, o), fi.has_neg_zero ? 0x80 : 0x00);
            // A negative value that rounds to zero: -0 where it exists, else +0.
            EXPECT_EQ(encode(-fi.min_subnormal / 4, f, o), fi.has_neg_zero ? 0x80 : 0x00);
        }
    }
    EXPECT_EQ(encode(inf, Format::e5m2, nosat), 0x7c);
    EXPECT_EQ(encode(-inf, Format::e5m2, nosat), 0xfc);
}

// e8m0fnu follows ml_dtypes (checked against it in tests/golden/test_mldtypes): no zero, no sign.
TEST(Encode, E8m0) {
    const Format f = Format::e8m0fnu;
    EXPECT_EQ(encode(1.0f, f), 0x7f);
    EXPECT_EQ(encode(1.4999f, f), 0x7f);
    EXPECT_EQ(encode(1.5f, f), 0x80);  // half up
    EXPECT_EQ(encode(3.0f, f), 0x81);
    EXPECT_EQ(encode(std::ldexp(1.0f, -127), f), 0x00);
    EXPECT_EQ(encode(std::ldexp(1.0f, -140), f), 0x00);
    EXPECT_EQ(encode(std::ldexp(3.0f, -128), f), 0x01);
    EXPECT_EQ(encode(std::ldexp(1.0f, 127), f), 0xfe);
    EXPECT_EQ(encode(std::ldexp(1.5f, 127), f, sat), 0xfe);
    EXPECT_EQ(encode(std::ldexp(1.5f, 127), f, nosat), 0xff);
    EXPECT_EQ(encode(std::numeric_limits<float>::infinity(), f, sat), 0xfe);
    for (float bad : {0.0f, -0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) EXPECT_EQ(encode(bad, f), 0xff);
}

// Every code decodes and re-encodes to itself (NaN to a NaN), in both modes.
TEST(RoundTrip, EveryCodeOfEveryFormat) {
    for (Format f : all_formats) {
        for (Overflow o : {sat, nosat}) {
            for (int c = 0; c < 256; ++c) {
                const uint8_t code = uint8_t(c);
                const uint8_t back = encode(decode(code, f), f, o);
                if (is_nan(code, f)) {
                    EXPECT_TRUE(is_nan(back, f)) << to_string(f) << " " << hex(code, 2);
                } else if (o == sat && format_info(f).has_inf && (code & 0x7f) == 0x7c) {
                    EXPECT_EQ(back, (code & 0x80) | format_info(f).max_code);  // Inf saturates
                } else {
                    EXPECT_EQ(back, code) << to_string(f) << " " << to_string(o) << " " << hex(code, 2);
                }
                // And through the 16-bit types, which hold every value exactly.
                if (f != Format::e8m0fnu && !is_nan(code, f)) {
                    EXPECT_EQ(encode(decode_bf16(code, f), f, nosat), code);
                    EXPECT_EQ(encode(decode_f16(code, f), f, nosat), code);
                }
            }
        }
    }
}

// Decoded values are ordered like the codes: positive codes increase with value.
TEST(Decode, MonotonicInCode) {
    for (Format f : all_formats) {
        float prev = -1.0f;
        const int last = f == Format::e8m0fnu ? 0xfe : 0x7f;
        for (int c = 0; c <= last; ++c) {
            const float v = decode(uint8_t(c), f);
            if (v != v || std::isinf(v)) continue;
            EXPECT_GT(v, prev) << to_string(f) << " " << hex(uint32_t(c), 2);
            prev = v;
        }
    }
}

}  // namespace
}  // namespace fp8kit::test
