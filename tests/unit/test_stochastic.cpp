// tests/unit/test_stochastic.cpp: stochastic rounding - only the two neighbouring codes occur,
// exact values never move, the mean over many roundings is the exact value (unbiased), and the
// result depends only on (seed, index): not on thread count or on converting in pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fp8kit/convert.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

constexpr Format signed_formats[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz};

// Mean of n stochastic roundings of x must equal x within 5 standard errors, and only the two
// nearest codes may appear (computed here by searching all codes, independently of the encoder).
void check_unbiased(float x, Format f, uint64_t seed) {
    const size_t n = 200000;
    std::vector<float> in(n, x);
    std::vector<uint8_t> out(n);
    encode_stochastic(in, out, f, {seed, 0});
    float below = -std::numeric_limits<float>::infinity(), above = std::numeric_limits<float>::infinity();
    for (int c = 0; c < 256; ++c) {
        const float v = decode(uint8_t(c), f);
        if (!std::isfinite(v)) continue;
        if (v <= x && v > below) below = v;
        if (v >= x && v < above) above = v;
    }
    double sum = 0;
    for (uint8_t c : out) {
        const float v = decode(c, f);
        ASSERT_TRUE(v == below || v == above) << to_string(f) << " x=" << x << " gave " << v;
        sum += v;
    }
    const double p = (double(x) - below) / (double(above) - below);  // exact probability of "up"
    const double sigma = (double(above) - below) * std::sqrt(p * (1 - p) / double(n));
    EXPECT_NEAR(sum / double(n), double(x), 5 * sigma + 1e-12 * std::fabs(x)) << to_string(f) << " x=" << x;
}

TEST(Stochastic, UnbiasedForNormalsAndSubnormals) {
    for (Format f : signed_formats) {
        const FormatInfo fi = format_info(f);
        // Normal range, a subnormal, between zero and the smallest subnormal, negative.
        for (float x : {1.3f, 100.7f, -3.14159f, fi.min_normal * 0.6f, fi.min_subnormal * 0.3f, -fi.max * 0.9f}) {
            check_unbiased(x, f, 42);
        }
    }
}

TEST(Stochastic, ExactValuesAndSpecialsAreFixed) {
    for (Format f : signed_formats) {
        for (int c = 0; c < 256; ++c) {
            const float v = decode(uint8_t(c), f);
            for (uint32_t r : {0u, 1u, 0x80000000u, 0xffffffffu}) {
                const uint8_t got = encode_stochastic(v, f, r, Overflow::nonsaturating);
                if (is_nan(uint8_t(c), f)) {
                    EXPECT_TRUE(is_nan(got, f));
                } else {
                    EXPECT_EQ(got, uint8_t(c)) << to_string(f) << " " << hex(uint32_t(c), 2) << " r=" << r;
                }
            }
        }
        // Saturation: values above max never exceed max; nonsaturating overflow follows encode().
        const FormatInfo fi = format_info(f);
        EXPECT_EQ(encode_stochastic(fi.max * 1.01f, f, 0xffffffffu, Overflow::saturate), fi.max_code);
        EXPECT_EQ(encode_stochastic(std::numeric_limits<float>::infinity(), f, 0, Overflow::nonsaturating),
                  encode(std::numeric_limits<float>::infinity(), f, Overflow::nonsaturating));
    }
}

TEST(Stochastic, ReproducibleIndependentOfThreadsAndPieces) {
    const size_t n = (size_t(1) << 18) + 11;
    std::vector<float> in(n);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : in) x = normal(rng);
    const int saved = num_threads();
    std::vector<uint8_t> a(n), b(n), c(n), d(n);
    set_num_threads(1);
    encode_stochastic(in, a, Format::e5m2, {1234, 0});
    set_num_threads(2);
    encode_stochastic(in, b, Format::e5m2, {1234, 0});
    set_num_threads(saved);
    EXPECT_EQ(a, b);
    // In two pieces with offsets: the same codes.
    const size_t cut = 100003;
    encode_stochastic(std::span(in).first(cut), std::span(c).first(cut), Format::e5m2, {1234, 0});
    encode_stochastic(std::span(in).subspan(cut), std::span(c).subspan(cut), Format::e5m2, {1234, cut});
    EXPECT_EQ(a, c);
    // Another seed changes a large fraction of the inexact ones.
    encode_stochastic(in, d, Format::e5m2, {1235, 0});
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += a[i] != d[i];
    EXPECT_GT(differ, n / 10);
}

}  // namespace
}  // namespace fp8kit::test
