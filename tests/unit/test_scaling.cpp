// tests/unit/test_scaling.cpp: the scale arithmetic of NUMERICS.md ("Scales") - compute_scale's
// edge cases and float64 agreement, the MX shared exponent (floor and up rules, clamping, the
// quantize multiplier), scaling groups and their names, recipe defaults ("Recipes") and the
// delayed-scaling state. Every expected value is derived here by hand or in float64 arithmetic
// (std::frexp / std::ilogb / std::ldexp), not taken from the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <deque>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/error.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/scaling.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

const Format data_formats[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz};

// fp8_max / amax in float64, rounded once to float32; a quotient above FLT_MAX gives FLT_MAX (it
// either rounds to FLT_MAX or overflows to Inf, which the rule replaces by FLT_MAX). Both operands
// are float32 and double has 53 >= 2 * 24 + 2 significand bits, so rounding the correctly rounded
// double quotient to float32 gives the correctly rounded float32 quotient (double rounding of a
// division is innocuous here): this is the IEEE float32 division NUMERICS.md asks for.
float scale_f64(float amax, float fp8_max) {
    const double q = double(fp8_max) / double(amax);
    return q > double(FLT_MAX) ? FLT_MAX : float(q);
}

// Random positive finite float32: uniform over the bit patterns (so every binade, subnormals
// included, is sampled).
float random_positive(std::mt19937& rng) {
    std::uniform_int_distribution<uint32_t> d(1, 0x7f7fffffu);
    return from_bits(d(rng));
}

// ---- compute_scale ----

TEST(ComputeScale, ZeroNanInfGiveTheFallback) {
    for (float fp8_max : {448.0f, 57344.0f, 240.0f}) {
        for (float amax : {0.0f, -0.0f, NAN, INFINITY, -INFINITY}) {
            EXPECT_EQ(bits(compute_scale(amax, fp8_max)), bits(1.0f)) << amax;
            EXPECT_EQ(compute_scale(amax, fp8_max, 0.0f, false, 2.5f), 2.5f) << amax;
            EXPECT_EQ(compute_scale(amax, fp8_max, 0.0f, true, 3.0f), 3.0f) << amax;  // fallback as given
        }
        // NaN stays NaN through the epsilon comparison: still the fallback.
        EXPECT_EQ(compute_scale(NAN, fp8_max, 1e-3f, false, 7.0f), 7.0f);
        EXPECT_EQ(compute_scale(INFINITY, fp8_max, 1e-3f, false, 7.0f), 7.0f);
    }
}

TEST(ComputeScale, OverflowingQuotientGivesFltMax) {
    // Every subnormal amax (and small normals): 448 / amax is above FLT_MAX.
    for (float amax : {0x1p-149f, 1e-45f, 1e-40f, 0x1p-127f, FLT_MIN, 1e-37f}) {
        ASSERT_GT(448.0 / double(amax), double(FLT_MAX)) << amax;
        EXPECT_EQ(bits(compute_scale(amax, 448.0f)), bits(FLT_MAX)) << amax;
    }
    // The boundary: the largest amax whose float32 quotient overflows, and the next float up.
    const double inf_from = 0x1p128 - 0x1p103;  // float32 quotients at or above this round to Inf
    float a = float(448.0 / inf_from);
    while (448.0 / double(a) >= inf_from) a = std::nextafter(a, 1.0f);  // up to a finite quotient
    while (448.0 / double(a) < inf_from) a = std::nextafter(a, 0.0f);   // down to the last Inf one
    const float lo = a, hi = std::nextafter(a, 1.0f);
    ASSERT_GE(448.0 / double(lo), inf_from);
    ASSERT_LT(448.0 / double(hi), inf_from);
    // lo: the float32 quotient is Inf -> FLT_MAX. hi: finite, the float64 value rounded.
    EXPECT_EQ(bits(compute_scale(lo, 448.0f)), bits(FLT_MAX));
    EXPECT_EQ(bits(compute_scale(hi, 448.0f)), bits(scale_f64(hi, 448.0f)));
}

TEST(ComputeScale, FltMaxAmaxIsAnExactFloatDivision) {
    for (float fp8_max : {448.0f, 57344.0f, 240.0f}) {
        const float want = float(double(fp8_max) / double(FLT_MAX));
        EXPECT_EQ(bits(compute_scale(FLT_MAX, fp8_max)), bits(want)) << fp8_max;
        EXPECT_GT(want, FLT_MIN);  // a normal float32: no subnormal double rounding
    }
    // Hand values: 448 / 448 = 1, 448 / 1 = 448, 448 / 3.5 = 128, 57344 / 2 = 28672.
    EXPECT_EQ(compute_scale(448.0f, 448.0f), 1.0f);
    EXPECT_EQ(compute_scale(1.0f, 448.0f), 448.0f);
    EXPECT_EQ(compute_scale(3.5f, 448.0f), 128.0f);
    EXPECT_EQ(compute_scale(2.0f, 57344.0f), 28672.0f);
}

TEST(ComputeScale, EpsilonRaisesSmallAmax) {
    // amax below epsilon counts as epsilon: 448 / 2^-10 = 458752.
    EXPECT_EQ(compute_scale(1e-6f, 448.0f, 0x1p-10f), 458752.0f);
    EXPECT_EQ(compute_scale(0x1p-11f, 448.0f, 0x1p-10f), 458752.0f);
    // amax 0 is raised to epsilon first (TransformerEngine), so it is no longer the fallback case.
    EXPECT_EQ(compute_scale(0.0f, 448.0f, 0x1p-10f), 458752.0f);
    // Not exact powers of two: compared with float64.
    const float eps = 1e-3f;
    EXPECT_EQ(bits(compute_scale(1e-5f, 448.0f, eps)), bits(scale_f64(eps, 448.0f)));
    // Above epsilon: untouched.
    EXPECT_EQ(bits(compute_scale(0.5f, 448.0f, eps)), bits(896.0f));
    EXPECT_EQ(bits(compute_scale(3.0f, 448.0f, eps)), bits(scale_f64(3.0f, 448.0f)));
}

TEST(ComputeScale, PowerOfTwoClearsTheMantissa) {
    // 448 / 3 = 149.33 -> 128; 448 / 1 = 448 -> 256; 448 / 448 = 1 -> 1; 448 / 500 = 0.896 -> 0.5.
    EXPECT_EQ(compute_scale(3.0f, 448.0f, 0.0f, true), 128.0f);
    EXPECT_EQ(compute_scale(1.0f, 448.0f, 0.0f, true), 256.0f);
    EXPECT_EQ(compute_scale(448.0f, 448.0f, 0.0f, true), 1.0f);
    EXPECT_EQ(compute_scale(500.0f, 448.0f, 0.0f, true), 0.5f);
    // Overflow: FLT_MAX with its mantissa cleared is 2^127.
    EXPECT_EQ(compute_scale(1e-45f, 448.0f, 0.0f, true), 0x1p127f);
    // Fallback is returned as given (not rounded).
    EXPECT_EQ(compute_scale(0.0f, 448.0f, 0.0f, true, 3.0f), 3.0f);
    // Random amax: 2^floor(log2(the float32 quotient)).
    std::mt19937 rng(7);
    for (int n = 0; n < 10000; ++n) {
        const float amax = random_positive(rng);
        for (float fp8_max : {448.0f, 57344.0f}) {
            const float q = scale_f64(amax, fp8_max);
            int e = 0;
            (void)std::frexp(double(q), &e);  // q = f * 2^e, f in [0.5, 1)
            const float want = float(std::ldexp(1.0, e - 1));
            ASSERT_EQ(bits(compute_scale(amax, fp8_max, 0.0f, true)), bits(want)) << amax << " " << fp8_max;
        }
    }
}

TEST(ComputeScale, RandomAmaxMatchesFloat64) {
    std::mt19937 rng(2024);
    std::uniform_real_distribution<double> log_u(-30.0, 30.0);
    for (int n = 0; n < 10000; ++n) {
        // Half over all bit patterns, half log-uniform around the usual range.
        const float amax = n % 2 ? random_positive(rng) : float(std::exp2(log_u(rng)));
        for (Format f : data_formats) {
            const float fp8_max = format_info(f).max;
            ASSERT_EQ(bits(compute_scale(amax, fp8_max)), bits(scale_f64(amax, fp8_max)))
                << "amax " << hex(bits(amax), 8) << " max " << fp8_max;
        }
    }
}

// ---- MX shared exponents ----

TEST(MxScale, EmaxPerFormat) {
    EXPECT_EQ(mx_emax(Format::e4m3fn), 8);    // 448 = 1.75 * 2^8
    EXPECT_EQ(mx_emax(Format::e5m2), 15);     // 57344 = 1.75 * 2^15
    EXPECT_EQ(mx_emax(Format::e4m3fnuz), 7);  // 240 = 1.875 * 2^7
    EXPECT_EQ(mx_emax(Format::e5m2fnuz), 15); // 57344
    for (Format f : data_formats) EXPECT_EQ(mx_emax(f), std::ilogb(double(format_info(f).max)));
}

// floor(log2(amax)) - emax, clamped to [-127, 127], as an e8m0 code (+127), in float64.
int floor_code_f64(float amax, Format f) {
    const int e = std::clamp(std::ilogb(double(amax)) - mx_emax(f), -127, 127);
    return e + 127;
}

TEST(MxScale, FloorRuleHandValues) {
    const Format e4 = Format::e4m3fn, e5 = Format::e5m2;
    const MxRounding fl = MxRounding::floor;
    EXPECT_EQ(mx_scale_code(1.0f, e4, fl), 127 - 8);
    EXPECT_EQ(mx_scale_code(448.0f, e4, fl), 127);       // 2^8 -> X = 1
    EXPECT_EQ(mx_scale_code(500.0f, e4, fl), 127);       // still 2^8: 500 saturates (spec)
    EXPECT_EQ(mx_scale_code(511.99f, e4, fl), 127);
    EXPECT_EQ(mx_scale_code(512.0f, e4, fl), 128);
    EXPECT_EQ(mx_scale_code(1.0f, e5, fl), 127 - 15);
    EXPECT_EQ(mx_scale_code(0.75f, Format::e4m3fnuz, fl), 127 - 1 - 7);
    // FLT_MAX: 2^127 binade -> 127 - emax.
    EXPECT_EQ(mx_scale_code(FLT_MAX, e4, fl), 127 + 127 - 8);
    EXPECT_EQ(mx_scale_code(FLT_MAX, e5, fl), 127 + 127 - 15);
    // Subnormals: 2^-149 -> -157 -> clamped to -127 (code 0); 2^-130 * 1.5 -> -130 - 8 -> 0.
    EXPECT_EQ(mx_scale_code(0x1p-149f, e4, fl), 0);
    EXPECT_EQ(mx_scale_code(0x1.8p-130f, e4, fl), 0);
    // The lower clamp edge: 2^-119 - 8 = -127 exactly (code 0), 2^-118 -> code 1, 2^-120 clamped.
    EXPECT_EQ(mx_scale_code(0x1p-119f, e4, fl), 0);
    EXPECT_EQ(mx_scale_code(0x1p-118f, e4, fl), 1);
    EXPECT_EQ(mx_scale_code(0x1.fp-120f, e4, fl), 0);
    // (The upper clamp, 127, is out of reach for data formats: log2(FLT_MAX) < 128 and emax >= 7,
    // so e <= 120, or 121 rounding up.)
    EXPECT_EQ(mx_scale_code(FLT_MAX, Format::e4m3fnuz, MxRounding::up), 127 + 128 - 7);
    EXPECT_EQ(mx_scale_code(0x1p-112f, e5, fl), 0);
    EXPECT_EQ(mx_scale_code(0x1p-111f, e5, fl), 1);
    // NaN / Inf: the NaN scale. Zero: 2^-127 (code 0).
    for (Format f : data_formats) {
        for (MxRounding r : {MxRounding::floor, MxRounding::up}) {
            EXPECT_EQ(mx_scale_code(NAN, f, r), 0xff);
            EXPECT_EQ(mx_scale_code(INFINITY, f, r), 0xff);
            EXPECT_EQ(mx_scale_code(-INFINITY, f, r), 0xff);
            EXPECT_EQ(mx_scale_code(0.0f, f, r), 0x00);
            EXPECT_EQ(mx_scale_code(-0.0f, f, r), 0x00);
        }
    }
}

TEST(MxScale, FloorRuleMatchesIlogbForNormalAndSubnormalAmax) {
    std::mt19937 rng(11);
    for (int n = 0; n < 20000; ++n) {
        const float amax = random_positive(rng);
        for (Format f : data_formats) {
            ASSERT_EQ(int(mx_scale_code(amax, f, MxRounding::floor)), floor_code_f64(amax, f))
                << hex(bits(amax), 8) << " " << to_string(f);
        }
    }
    // Every subnormal binade.
    for (int k = 0; k < 23; ++k) {
        const float amax = from_bits(1u << k);
        ASSERT_EQ(std::ilogb(double(amax)), -149 + k);
        for (Format f : data_formats) EXPECT_EQ(int(mx_scale_code(amax, f, MxRounding::floor)), floor_code_f64(amax, f));
    }
}

TEST(MxScale, UpRuleIsTheSmallestPowerOfTwoThatDoesNotSaturate) {
    // Hand values, e4m3fn: 448 fits (X = 1); 449 does not (449 > 448 -> X = 2); 500 -> X = 2.
    EXPECT_EQ(mx_scale_code(448.0f, Format::e4m3fn, MxRounding::up), 127);
    EXPECT_EQ(mx_scale_code(std::nextafter(448.0f, 1e9f), Format::e4m3fn, MxRounding::up), 128);
    EXPECT_EQ(mx_scale_code(500.0f, Format::e4m3fn, MxRounding::up), 128);
    EXPECT_EQ(mx_scale_code(256.0f, Format::e4m3fn, MxRounding::up), 127);
    // e4m3fnuz: max 240 = 1.875 * 2^7: 240 -> X = 1, 241 -> X = 2.
    EXPECT_EQ(mx_scale_code(240.0f, Format::e4m3fnuz, MxRounding::up), 127);
    EXPECT_EQ(mx_scale_code(241.0f, Format::e4m3fnuz, MxRounding::up), 128);

    std::mt19937 rng(5);
    std::uniform_real_distribution<double> log_u(-100.0, 127.9);
    for (int n = 0; n < 20000; ++n) {
        // Away from the lower clamp (where no power of two is small enough to matter).
        const float amax = n % 2 ? float(std::exp2(log_u(rng))) : std::max(random_positive(rng), 0x1p-100f);
        for (Format f : data_formats) {
            const double fp8_max = format_info(f).max;
            const int code = mx_scale_code(amax, f, MxRounding::up);
            ASSERT_LT(code, 0xff);
            const int e = code - 127;
            // amax / 2^e <= fp8_max, and 2^e is the smallest such power: amax / 2^(e-1) > fp8_max.
            ASSERT_LE(std::ldexp(double(amax), -e), fp8_max) << hex(bits(amax), 8) << " " << to_string(f);
            ASSERT_GT(std::ldexp(double(amax), -(e - 1)), fp8_max) << hex(bits(amax), 8) << " " << to_string(f);
            // Never below floor, at most one above it.
            const int fl = mx_scale_code(amax, f, MxRounding::floor);
            ASSERT_TRUE(code == fl || code == fl + 1);
        }
    }
}

TEST(MxScale, QuantizeMultiplierIsTheExactInverse) {
    for (int c = 0; c <= 254; ++c) {
        const uint8_t code = uint8_t(c);
        const float m = mx_quantize_multiplier(code);
        EXPECT_EQ(bits(m), bits(float(std::ldexp(1.0, 127 - c)))) << c;
        EXPECT_EQ(decode(code, Format::e8m0fnu), float(std::ldexp(1.0, c - 127))) << c;
        EXPECT_EQ(m * decode(code, Format::e8m0fnu), 1.0f) << c;
    }
    EXPECT_EQ(mx_quantize_multiplier(0xff), 1.0f);  // NaN block: elements unscaled
    EXPECT_TRUE(std::isnan(decode(0xff, Format::e8m0fnu)));
}

// ---- Scaling groups ----

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

TEST(Scaling, GroupAndScaleShapes) {
    const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {17, 33}, {127, 257}, {256, 256}};
    for (const auto& [r, c] : shapes) {
        SCOPED_TRACE(std::to_string(r) + "x" + std::to_string(c));
        EXPECT_EQ(Scaling::tensor().group_shape(r, c), (GroupShape{r, c}));
        EXPECT_EQ(Scaling::tensor().scale_shape(r, c), (GroupShape{1, 1}));
        EXPECT_EQ(Scaling::row().group_shape(r, c), (GroupShape{1, c}));
        EXPECT_EQ(Scaling::row().scale_shape(r, c), (GroupShape{r, 1}));
        EXPECT_EQ(Scaling::column().group_shape(r, c), (GroupShape{r, 1}));
        EXPECT_EQ(Scaling::column().scale_shape(r, c), (GroupShape{1, c}));
        EXPECT_EQ(Scaling::mx32().group_shape(r, c), (GroupShape{1, 32}));
        EXPECT_EQ(Scaling::mx32().scale_shape(r, c), (GroupShape{r, ceil_div(c, 32)}));
        for (auto [br, bc] : {std::pair<int64_t, int64_t>{1, 128}, {128, 128}, {3, 5}}) {
            const Scaling b = Scaling::block(br, bc);
            EXPECT_EQ(b.group_shape(r, c), (GroupShape{br, bc}));
            EXPECT_EQ(b.scale_shape(r, c), (GroupShape{ceil_div(r, br), ceil_div(c, bc)}));
        }
    }
    // Spot values written out: 127x257 with 128x128 blocks -> 1 x 3; 3x5 blocks -> 43 x 52.
    EXPECT_EQ(Scaling::block(128, 128).scale_shape(127, 257), (GroupShape{1, 3}));
    EXPECT_EQ(Scaling::block(3, 5).scale_shape(127, 257), (GroupShape{43, 52}));
    EXPECT_EQ(Scaling::block(1, 128).scale_shape(256, 256), (GroupShape{256, 2}));
    EXPECT_EQ(Scaling::mx32().scale_shape(17, 33), (GroupShape{17, 2}));

    expect_error([] { (void)Scaling::block(0, 4).group_shape(8, 8); }, "0x4");
    expect_error([] { (void)Scaling::block(4, 0).scale_shape(8, 8); }, "4x0");
    expect_error([] { (void)Scaling::block(-1, 4).scale_shape(8, 8); }, "dimension < 1");
    // Past 2^31 a block is refused (its group count would overflow int64 near the largest int64):
    // the bound itself is taken, one more or the largest int64 are not, in either dimension.
    const int64_t most = Scaling::max_block_dim, huge = std::numeric_limits<int64_t>::max();
    EXPECT_EQ(Scaling::block(most, 1).scale_shape(8, 8), (GroupShape{1, 8}));
    EXPECT_EQ(Scaling::block(1, most).scale_shape(8, 8), (GroupShape{8, 1}));
    for (const auto& dims : {std::pair<int64_t, int64_t>{most + 1, 1}, {1, most + 1}, {huge, 1}, {1, huge}, {huge, huge}}) {
        const int64_t br = dims.first, bc = dims.second;  // (clang before 16 captures no structured binding)
        expect_error([&] { (void)Scaling::block(br, bc).scale_shape(8, 8); },
                     std::to_string(br) + "x" + std::to_string(bc) + " has a dimension above 2^31");
    }
}

TEST(Scaling, NamesRoundTrip) {
    const std::pair<Scaling, const char*> named[] = {
        {Scaling::tensor(), "tensor"}, {Scaling::row(), "row"}, {Scaling::column(), "column"},
        {Scaling::mx32(), "mx32"}, {Scaling::block(1, 128), "block(1x128)"}, {Scaling::block(128, 128), "block(128x128)"},
        {Scaling::block(3, 5), "block(3x5)"}};
    for (const auto& [s, name] : named) {
        EXPECT_EQ(to_string(s), name);
        // What to_string prints, parse_scaling reads back.
        try {
            EXPECT_EQ(parse_scaling(to_string(s)), s) << name;
        } catch (const Error& e) {
            ADD_FAILURE() << "parse_scaling(\"" << name << "\") threw: " << e.what();
        }
    }
    EXPECT_EQ(parse_scaling("block:1x128"), Scaling::block(1, 128));
    EXPECT_EQ(parse_scaling("block:128x128"), Scaling::block(128, 128));
    EXPECT_EQ(parse_scaling("block:3x5"), Scaling::block(3, 5));
    for (const char* bad : {"", "Tensor", "rows", "block", "block:", "block:1x", "block:x128", "block:0x128",
                            "block:1x0", "block:-1x4", "block:1x128x2", "block:ax1", "block:1 x128", "mx16"}) {
        std::string quoted(1, '\'');  // built by append: GCC 12 -Wrestrict misfires on "'" + str
        quoted.append(bad).push_back('\'');
        expect_error([&] { (void)parse_scaling(bad); }, quoted);
    }
}

// ---- Recipes ----

void expect_options(const QuantizeOptions& o, Format f, Scaling s, bool pow2) {
    EXPECT_EQ(o.format, f);
    EXPECT_EQ(o.scaling, s) << to_string(o.scaling);
    EXPECT_EQ(o.power_of_two, pow2);
    EXPECT_EQ(o.overflow, Overflow::saturate);
    EXPECT_FALSE(o.scale.defined());
    EXPECT_FALSE(o.transpose);
}

TEST(Recipe, DefaultsFollowTheNumericsTable) {
    const Format e4 = Format::e4m3fn, e5 = Format::e5m2;
    {
        SCOPED_TRACE("tensorwise");
        const Recipe r = Recipe::tensorwise();
        EXPECT_EQ(r.kind, RecipeKind::tensorwise);
        expect_options(r.options(Role::input), e4, Scaling::tensor(), false);
        expect_options(r.options(Role::weight), e4, Scaling::tensor(), false);
        expect_options(r.options(Role::grad_output), e5, Scaling::tensor(), false);
    }
    {
        SCOPED_TRACE("delayed");
        const Recipe r = Recipe::delayed();
        EXPECT_EQ(r.kind, RecipeKind::delayed);
        EXPECT_EQ(r.history_length, 1024);
        EXPECT_EQ(r.amax_compute, AmaxCompute::max);
        EXPECT_EQ(r.margin, 0);
        expect_options(r.options(Role::input), e4, Scaling::tensor(), false);
        expect_options(r.options(Role::weight), e4, Scaling::tensor(), false);
        expect_options(r.options(Role::grad_output), e5, Scaling::tensor(), false);
    }
    {
        SCOPED_TRACE("rowwise");
        const Recipe r = Recipe::rowwise();
        expect_options(r.options(Role::input), e4, Scaling::row(), true);
        expect_options(r.options(Role::weight), e4, Scaling::row(), true);
        expect_options(r.options(Role::grad_output), e4, Scaling::row(), true);
    }
    {
        SCOPED_TRACE("block");
        const Recipe r = Recipe::block();
        EXPECT_EQ(r.block_size, 128);
        expect_options(r.options(Role::input), e4, Scaling::block(1, 128), false);
        expect_options(r.options(Role::weight), e4, Scaling::block(128, 128), false);
        expect_options(r.options(Role::grad_output), e4, Scaling::block(1, 128), false);
        expect_options(Recipe::block(64).options(Role::weight), e4, Scaling::block(64, 64), false);
    }
    {
        SCOPED_TRACE("mxfp8");
        const Recipe r = Recipe::mxfp8();
        for (Role role : {Role::input, Role::weight, Role::grad_output}) {
            const QuantizeOptions o = r.options(role);
            expect_options(o, e4, Scaling::mx32(), false);
            EXPECT_EQ(o.mx_rounding, MxRounding::floor);  // the spec's rule by default
        }
        expect_options(Recipe::mxfp8(e5).options(Role::grad_output), e5, Scaling::mx32(), false);
        expect_options(Recipe::mxfp8(e5).options(Role::input), e4, Scaling::mx32(), false);
    }
}

TEST(Recipe, PureE5m2AndScaleFormatsAreRefused) {
    Recipe r = Recipe::tensorwise();
    r.forward = Format::e5m2;
    expect_error([&] { r.validate(); }, "e5m2");
    expect_error([&] { (void)r.options(Role::input); }, "e5m2");
    expect_error([&] { (void)r.options(Role::grad_output); }, "e5m2");
    r.forward = Format::e5m2fnuz;
    expect_error([&] { r.validate(); }, "e5m2");
    r = Recipe::tensorwise();
    r.forward = Format::e8m0fnu;
    expect_error([&] { (void)r.options(Role::input); }, "e8m0fnu");
    r = Recipe::tensorwise();
    r.backward = Format::e8m0fnu;
    expect_error([&] { (void)r.options(Role::grad_output); }, "e8m0fnu");
    expect_error([] { (void)Recipe::mxfp8(Format::e8m0fnu); }, "e8m0fnu");
    // The other fields named in validate().
    expect_error([] { (void)Recipe::delayed(0); }, "history_length");
    expect_error([] { (void)Recipe::delayed(16, AmaxCompute::max, -1); }, "margin");
    expect_error([] { (void)Recipe::block(0); }, "block_size");
    r = Recipe::tensorwise();
    r.amax_epsilon = NAN;
    expect_error([&] { r.validate(); }, "amax_epsilon");
    r.amax_epsilon = -1.0f;
    expect_error([&] { r.validate(); }, "amax_epsilon");
    // e4m3fnuz forward with e5m2fnuz gradients is a valid hybrid.
    r = Recipe::tensorwise();
    r.forward = Format::e4m3fnuz;
    r.backward = Format::e5m2fnuz;
    EXPECT_NO_THROW(r.validate());
    EXPECT_EQ(r.options(Role::grad_output).format, Format::e5m2fnuz);
}

TEST(Recipe, ParseNames) {
    const std::pair<const char*, RecipeKind> names[] = {{"tensorwise", RecipeKind::tensorwise},
                                                        {"delayed", RecipeKind::delayed},
                                                        {"rowwise", RecipeKind::rowwise},
                                                        {"block", RecipeKind::block},
                                                        {"mxfp8", RecipeKind::mxfp8}};
    for (const auto& [name, kind] : names) {
        const Recipe r = parse_recipe(name);
        EXPECT_EQ(r.kind, kind) << name;
        EXPECT_EQ(to_string(kind), name);
    }
    EXPECT_EQ(parse_recipe("rowwise").options(Role::input).scaling, Scaling::row());
    EXPECT_EQ(parse_recipe("block").options(Role::weight).scaling, Scaling::block(128, 128));
    EXPECT_EQ(parse_recipe("mxfp8").options(Role::input).scaling, Scaling::mx32());
    // mxfp8_rceil: mxfp8 with the exponent rounded up (torchao's RCEIL): each operand's options.
    const Recipe rceil = parse_recipe("mxfp8_rceil");
    EXPECT_EQ(rceil.kind, RecipeKind::mxfp8);
    for (Role role : {Role::input, Role::weight, Role::grad_output}) {
        EXPECT_EQ(rceil.options(role).scaling, Scaling::mx32());
        EXPECT_EQ(rceil.options(role).mx_rounding, MxRounding::up);
        EXPECT_EQ(parse_recipe("mxfp8").options(role).mx_rounding, MxRounding::floor);
    }
    expect_error([] { (void)parse_recipe("fp8"); }, "'fp8'");
    expect_error([] { (void)parse_recipe("Tensorwise"); }, "'Tensorwise'");
}

// ---- DelayedScaling ----

// The state, read back from its (host) tensors.
float scale_of(const DelayedScaling& d) { return d.scale().get({0}); }
std::vector<float> history_of(const DelayedScaling& d) {
    const Tensor& h = d.amax_history();
    return {h.data<const float>(), h.data<const float>() + h.numel()};
}


// A [4, 8] f32 tensor whose max |x| is exactly `amax` (at a negative element when `neg`), with
// the other elements smaller.
Tensor tensor_with_amax(float amax, bool neg = false) {
    std::vector<float> v(32);
    for (size_t k = 0; k < v.size(); ++k) v[k] = amax * float(k % 7) / 8.0f * (k % 2 ? -1.0f : 1.0f);
    v[13] = neg ? -amax : amax;
    return Tensor::from(v, {4, 8});
}

// The scale delayed scaling should hold after a step whose window (newest first) is `window`:
// fp8_max * 2^-margin / (max or most recent amax); 0, NaN or Inf keeps `previous`.
float expected_delayed(const std::deque<float>& window, AmaxCompute c, double fp8_max, int margin, float previous) {
    float a = window.front();
    if (c == AmaxCompute::max) {
        for (float h : window) {
            if (std::isnan(h)) return previous;
            a = std::max(a, h);
        }
    }
    if (!(a > 0.0f) || std::isinf(a)) return previous;
    const double q = std::ldexp(fp8_max, -margin) / double(a);
    return q > double(FLT_MAX) ? FLT_MAX : float(q);
}

TEST(DelayedScaling, ScaleFollowsTheAmaxHistory) {
    const float amaxes[] = {2.0f, 8.0f, 1.0f, 0.5f, 0.25f, 3.0f, 0.1f, 0.2f, 0.3f, 0.4f, 5.0f, 1.0f};
    for (AmaxCompute c : {AmaxCompute::max, AmaxCompute::most_recent}) {
        for (int margin : {0, 1}) {
            SCOPED_TRACE(std::string(c == AmaxCompute::max ? "max" : "most_recent") + " margin " + std::to_string(margin));
            const Recipe r = Recipe::delayed(4, c, margin);
            DelayedScaling ds(r, Role::input);
            EXPECT_EQ(scale_of(ds), 1.0f);
            ASSERT_EQ(history_of(ds).size(), 4u);
            for (float h : history_of(ds)) EXPECT_EQ(h, 0.0f);
            std::deque<float> window;
            for (size_t t = 0; t < std::size(amaxes); ++t) {
                SCOPED_TRACE("step " + std::to_string(t));
                const float before = scale_of(ds);
                const Tensor x = tensor_with_amax(amaxes[t], t % 3 == 1);
                const QTensor q = ds.quantize(x);
                // This step's cast uses the scale derived from earlier steps.
                ASSERT_EQ(q.scale_inv.numel(), 1);
                EXPECT_EQ(bits(q.scale_inv.get({0, 0})), bits(1.0f / before));
                ASSERT_TRUE(q.amax.defined());
                EXPECT_EQ(q.amax.get({0}), amaxes[t]);
                const float* xv = x.data<float>();
                const uint8_t* codes = q.data.data<uint8_t>();
                for (int64_t k = 0; k < 32; ++k) {
                    ASSERT_EQ(codes[k], encode(xv[k] * before, Format::e4m3fn)) << k;
                }
                EXPECT_EQ(history_of(ds)[0], amaxes[t]);
                ds.step();
                window.push_front(amaxes[t]);
                if (window.size() > 4) window.pop_back();
                EXPECT_EQ(bits(scale_of(ds)), bits(expected_delayed(window, c, 448.0, margin, before)));
            }
        }
    }
}

TEST(DelayedScaling, HandValuesForMaxMostRecentAndMargin) {
    // max over 4 steps: after amaxes 2, 8, 1 the scale is 448 / 8 = 56; most_recent: 448 / 1.
    DelayedScaling mx(Recipe::delayed(4, AmaxCompute::max), Role::input);
    DelayedScaling mr(Recipe::delayed(4, AmaxCompute::most_recent), Role::input);
    DelayedScaling mg(Recipe::delayed(4, AmaxCompute::max, 1), Role::input);
    for (float a : {2.0f, 8.0f, 1.0f}) {
        for (DelayedScaling* d : {&mx, &mr, &mg}) {
            (void)d->quantize(tensor_with_amax(a));
            d->step();
        }
    }
    EXPECT_EQ(scale_of(mx), 56.0f);
    EXPECT_EQ(scale_of(mr), 448.0f);
    EXPECT_EQ(scale_of(mg), 28.0f);  // margin 1: 224 / 8
    // Two more steps: 8 is still in the window of 4 (8, 1, 0.5, 0.5) ... then it leaves.
    for (int k = 0; k < 2; ++k) {
        (void)mx.quantize(tensor_with_amax(0.5f));
        mx.step();
    }
    EXPECT_EQ(scale_of(mx), 56.0f);  // window: 0.5, 0.5, 1, 8
    (void)mx.quantize(tensor_with_amax(0.5f));
    mx.step();
    EXPECT_EQ(scale_of(mx), 448.0f);  // window: 0.5, 0.5, 0.5, 1
    // Gradients use e5m2: 57344 / 8 = 7168.
    DelayedScaling g(Recipe::delayed(4), Role::grad_output);
    const QTensor qg = g.quantize(tensor_with_amax(8.0f));
    EXPECT_EQ(qg.format(), Format::e5m2);
    g.step();
    EXPECT_EQ(scale_of(g), 7168.0f);
}

TEST(DelayedScaling, ZeroAndNanStepsKeepThePreviousScale) {
    // most_recent: one zero step has amax 0 -> keep. Likewise a history of length 1 with max.
    for (const Recipe& r : {Recipe::delayed(4, AmaxCompute::most_recent), Recipe::delayed(1, AmaxCompute::max)}) {
        DelayedScaling ds(r, Role::input);
        (void)ds.quantize(tensor_with_amax(2.0f));
        ds.step();
        ASSERT_EQ(scale_of(ds), 224.0f);
        (void)ds.quantize(Tensor::zeros({4, 8}, DType::f32));
        ds.step();
        EXPECT_EQ(scale_of(ds), 224.0f);
        // A step with no quantize at all: amax 0 as well.
        ds.step();
        EXPECT_EQ(scale_of(ds), 224.0f);
        (void)ds.quantize(tensor_with_amax(4.0f));
        ds.step();
        EXPECT_EQ(scale_of(ds), 112.0f);
    }
    // NaN: keeps the previous scale for as long as it is in the max window.
    DelayedScaling ds(Recipe::delayed(3, AmaxCompute::max), Role::input);
    (void)ds.quantize(tensor_with_amax(2.0f));
    ds.step();
    ASSERT_EQ(scale_of(ds), 224.0f);
    Tensor bad = tensor_with_amax(1.0f);
    bad.set({2, 5}, NAN);
    const QTensor qn = ds.quantize(bad);
    EXPECT_TRUE(std::isnan(qn.amax.get({0})));
    EXPECT_TRUE(std::isnan(history_of(ds)[0]));
    // A later, smaller cast in the same step does not hide the NaN.
    (void)ds.quantize(tensor_with_amax(0.5f));
    EXPECT_TRUE(std::isnan(history_of(ds)[0]));
    ds.step();
    EXPECT_EQ(scale_of(ds), 224.0f);
    for (int k = 0; k < 2; ++k) {  // NaN at [1], then [2]: still in the window
        (void)ds.quantize(tensor_with_amax(1.0f));
        ds.step();
        EXPECT_EQ(scale_of(ds), 224.0f) << k;
    }
    (void)ds.quantize(tensor_with_amax(1.0f));
    ds.step();  // window 1, 1, 1: the NaN has left
    EXPECT_EQ(scale_of(ds), 448.0f);
    // Inf likewise (most_recent).
    DelayedScaling di(Recipe::delayed(4, AmaxCompute::most_recent), Role::input);
    (void)di.quantize(tensor_with_amax(7.0f));
    di.step();
    ASSERT_EQ(scale_of(di), 64.0f);
    Tensor inf = tensor_with_amax(1.0f);
    inf.set({0, 0}, -INFINITY);
    (void)di.quantize(inf);
    EXPECT_EQ(history_of(di)[0], INFINITY);
    di.step();
    EXPECT_EQ(scale_of(di), 64.0f);
}

TEST(DelayedScaling, HistoryRollsOncePerStepAndKeepsTheLargestAmax) {
    DelayedScaling ds(Recipe::delayed(4), Role::input);
    (void)ds.quantize(tensor_with_amax(3.0f));
    (void)ds.quantize(tensor_with_amax(1.0f, true));  // smaller: [0] stays 3
    EXPECT_EQ(history_of(ds)[0], 3.0f);
    ds.step();
    EXPECT_EQ(history_of(ds)[0], 0.0f);
    EXPECT_EQ(history_of(ds)[1], 3.0f);
    (void)ds.quantize(tensor_with_amax(1.0f));
    (void)ds.quantize(tensor_with_amax(5.0f, true));  // larger: [0] becomes 5
    EXPECT_EQ(history_of(ds)[0], 5.0f);
    EXPECT_EQ(history_of(ds)[1], 3.0f);
    ds.step();
    const std::vector<float> want = {0.0f, 5.0f, 3.0f, 0.0f};
    EXPECT_EQ(history_of(ds), want);
    ds.step();  // a step without casts still rolls
    const std::vector<float> want2 = {0.0f, 0.0f, 5.0f, 3.0f};
    EXPECT_EQ(history_of(ds), want2);
    ds.step();  // 3 falls off the end
    const std::vector<float> want3 = {0.0f, 0.0f, 0.0f, 5.0f};
    EXPECT_EQ(history_of(ds), want3);
    EXPECT_EQ(history_of(ds).size(), 4u);
}

TEST(DelayedScaling, QuantizeUsesTheCurrentScaleLikeAGivenScale) {
    DelayedScaling ds(Recipe::delayed(8), Role::input);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    std::vector<float> v(6 * 40);
    for (float& e : v) e = nd(rng);
    const Tensor x = Tensor::from(v, {6, 40});
    (void)ds.quantize(tensor_with_amax(1.7f));
    ds.step();
    const float s = scale_of(ds);
    ASSERT_EQ(bits(s), bits(scale_f64(1.7f, 448.0f)));
    const QTensor q = ds.quantize(x, true);
    QuantizeOptions o = Recipe::delayed().options(Role::input);
    o.scale = Tensor::full({1}, s);
    const QTensor want = quantize(x, o);
    EXPECT_EQ(bits(q.scale_inv.get({0, 0})), bits(1.0f / s));
    EXPECT_EQ(bits(want.scale_inv.get({0, 0})), bits(1.0f / s));
    ASSERT_EQ(q.data.numel(), want.data.numel());
    for (int64_t k = 0; k < q.data.numel(); ++k) {
        ASSERT_EQ(q.data.data<uint8_t>()[k], want.data.data<uint8_t>()[k]) << k;
        ASSERT_EQ(q.data.data<uint8_t>()[k], encode(v[size_t(k)] * s, Format::e4m3fn)) << k;
    }
    // The transposed copy was asked for and uses the same scale.
    ASSERT_TRUE(q.has_transpose());
    EXPECT_EQ(bits(q.scale_inv_t.get({0, 0})), bits(1.0f / s));
    for (int64_t i = 0; i < 6; ++i) {
        for (int64_t j = 0; j < 40; ++j) {
            ASSERT_EQ(q.data_t.at<uint8_t>({j, i}), encode(v[size_t(i * 40 + j)] * s, Format::e4m3fn));
        }
    }
    // amax of x recorded although the scale was given.
    float a = 0.0f;
    for (float e : v) a = std::max(a, std::fabs(e));
    EXPECT_EQ(history_of(ds)[0], a);
    // Only delayed recipes.
    expect_error([] { (void)DelayedScaling(Recipe::tensorwise(), Role::input); }, "delayed");
}

TEST(DelayedScaling, RestoredStateContinuesAsTheSavedOne) {
    // A state read out after three steps and put into a fresh one: both then cast the same codes
    // with the same scales and roll the same history (the saved layer's run continued).
    DelayedScaling saved(Recipe::delayed(4, AmaxCompute::max), Role::input);
    for (float a : {2.0f, 8.0f, 1.0f}) {
        (void)saved.quantize(tensor_with_amax(a));
        saved.step();
    }
    DelayedScaling loaded(Recipe::delayed(4, AmaxCompute::max), Role::input);
    loaded.restore(saved.amax_history().clone(), saved.scale().clone(), saved.fresh());
    EXPECT_FALSE(loaded.fresh());
    for (float a : {0.5f, 16.0f}) {
        const QTensor p = saved.quantize(tensor_with_amax(a)), q = loaded.quantize(tensor_with_amax(a));
        EXPECT_EQ(bits(p.scale_inv.get({0, 0})), bits(q.scale_inv.get({0, 0})));
        EXPECT_EQ(std::memcmp(p.data.const_raw_data(), q.data.const_raw_data(), size_t(p.data.nbytes())), 0);
        saved.step();
        loaded.step();
        EXPECT_EQ(history_of(saved), history_of(loaded));
    }
    // The state is a copy: writing the tensors it was given later changes nothing.
    Tensor h = saved.amax_history().clone(), s = saved.scale().clone();
    loaded.restore(h, s, false);
    h.data<float>()[0] = 1e9f;
    EXPECT_EQ(history_of(loaded), history_of(saved));
    // Refusals name the argument.
    const auto refused = [&](const Tensor& hist, const Tensor& sc, const std::string& want) {
        try {
            loaded.restore(hist, sc, false);
            ADD_FAILURE() << "no error, expected " << want;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
    };
    refused(Tensor::zeros({5}, DType::f32), s, "amax_history is f32 [5], expected f32 [4]");
    Tensor negative = Tensor::zeros({4}, DType::f32);
    negative.data<float>()[2] = -1.0f;
    refused(negative, s, "amax_history[2] is negative");
    for (const float bad : {0.0f, -2.0f, INFINITY, NAN}) {
        Tensor sc = Tensor::zeros({1}, DType::f32);
        sc.data<float>()[0] = bad;
        refused(saved.amax_history(), sc, "scale is not finite and positive");
    }
    refused(saved.amax_history(), Tensor::zeros({2}, DType::f32), "scale is f32 [2], expected f32 [1]");
}

}  // namespace
}  // namespace fp8kit::test
