// tests/ops/test_convert_exhaustive.cpp (label: slow): all 2^32 float32 inputs.
//  - every SIMD path's bulk encode equals the scalar encode() (the portable path), bit for bit,
//    for every format saturating, and nonsaturating with a scale (nonsaturating without one:
//    tests/golden/test_mldtypes.cpp, which holds every path to ml_dtypes and to the portable one);
//  - f16(float) equals the F16C hardware conversion (an independent oracle) for all 2^32 inputs,
//    and float(f16) for all 2^16 codes; bf16(float) is the nearest bf16, ties to even, judged in
//    double arithmetic, for all 2^32 inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fp8kit/convert.hpp"
#include "support.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FP8KIT_TEST_F16C 1
#endif

namespace fp8kit::test {
namespace {

constexpr uint64_t chunk = uint64_t(1) << 22;

// Calls body(first_bits, inputs) for consecutive chunks covering all 2^32 float32 bit patterns.
template <class Body>
void for_all_floats(Body&& body) {
    std::vector<float> in(chunk);
    for (uint64_t start = 0; start < (uint64_t(1) << 32); start += chunk) {
        for (uint64_t i = 0; i < chunk; ++i) in[i] = from_bits(uint32_t(start + i));
        body(uint32_t(start), in);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

struct Case {
    Format format;
    Overflow overflow;
    float scale;
};

class EncodeAllFloats : public ::testing::TestWithParam<Case> {};

TEST_P(EncodeAllFloats, EverySimdPathEqualsScalar) {
    const Format f = GetParam().format;
    const Overflow o = GetParam().overflow;
    const float scale = GetParam().scale;
    std::vector<Isa> simd;
    for (Isa isa : supported_isas()) {
        test::isas_run().insert(isa);  // the ISA coverage line at the end (tests/support.hpp)
        if (isa != Isa::portable) simd.push_back(isa);
    }
    if (simd.empty()) GTEST_SKIP() << "this CPU has no SIMD path; the portable path is the scalar function";
    const Isa saved = active_isa();
    std::vector<uint8_t> want(chunk), got(chunk);
    for_all_floats([&](uint32_t start, const std::vector<float>& in) {
        set_isa(Isa::portable);
        encode(in, want, f, o, scale);
        for (Isa isa : simd) {
            set_isa(isa);
            encode(in, got, f, o, scale);
            if (got != want) {
                for (uint64_t i = 0; i < chunk; ++i) {
                    ASSERT_EQ(got[i], want[i]) << to_string(isa) << " " << to_string(f) << " " << to_string(o)
                                               << " x=" << hex(uint32_t(start + i), 8) << " scale=" << scale;
                }
            }
        }
    });
    set_isa(saved);
}

std::vector<Case> all_cases() {
    std::vector<Case> cases;
    for (Format f : all_formats) cases.push_back({f, Overflow::saturate, 1.0f});
    // A scale exercises the multiply in each kernel (one float32 multiply before encoding).
    cases.push_back({Format::e4m3fn, Overflow::saturate, 0.3f});
    cases.push_back({Format::e5m2, Overflow::nonsaturating, 3.0f});
    return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, EncodeAllFloats, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                             return std::string(to_string(p.param.format)) + "_" +
                                    (p.param.overflow == Overflow::saturate ? "sat" : "nosat") +
                                    (p.param.scale == 1.0f ? "" : "_scaled");
                         });

#if defined(FP8KIT_TEST_F16C)
__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float x) {
    return uint16_t(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

TEST(Half, F16MatchesF16cHardwareForAllInputs) {
    if (!cpu_supports(Isa::avx2)) GTEST_SKIP() << "no F16C on this CPU to compare with";
    for (uint32_t h = 0; h < 65536; ++h) {
        ASSERT_TRUE(same_float(float(f16::from_bits(uint16_t(h))), hw_f16_to_f32(uint16_t(h)))) << hex(h, 4);
    }
    uint64_t mismatches = 0;
    for (uint64_t b = 0; b < (uint64_t(1) << 32); ++b) {
        const float x = from_bits(uint32_t(b));
        const uint16_t mine = f16(x).bits, hw = hw_f32_to_f16(x);
        if (mine != hw && ++mismatches < 5) ADD_FAILURE() << "x=" << hex(uint32_t(b), 8) << " f16 " << hex(mine, 4) << " hw " << hex(hw, 4);
    }
    EXPECT_EQ(mismatches, 0u);
}
#endif

// bf16(x) must be the nearest bf16 (by exact double distance), ties to the even code; NaN stays
// NaN; above the largest finite bf16's rounding boundary it is Inf.
TEST(Half, Bf16IsNearestEvenForAllInputs) {
    uint64_t mismatches = 0;
    for (uint64_t b = 0; b < (uint64_t(1) << 32); ++b) {
        const float x = from_bits(uint32_t(b));
        const bf16 r = bf16(x);
        if (std::isnan(x)) {
            if (!std::isnan(float(r)) && ++mismatches < 5) ADD_FAILURE() << "NaN lost: " << hex(uint32_t(b), 8);
            continue;
        }
        const uint16_t lo = uint16_t(b >> 16);  // truncation: the neighbour toward zero
        const uint16_t hi = uint16_t(lo + 1);   // the neighbour away from zero
        const double dx = x, dlo = float(bf16::from_bits(lo));
        // Past the largest finite bf16 the upper neighbour is Inf; IEEE rounds as if it were 2^128.
        const double dhi = (hi & 0x7fff) == 0x7f80 ? std::copysign(std::ldexp(1.0, 128), dx)
                                                    : double(float(bf16::from_bits(hi)));
        uint16_t want;
        if ((b & 0xffff) == 0) {
            want = lo;
        } else {
            const double d_lo = std::fabs(dx - dlo), d_hi = std::fabs(dhi - dx);
            want = d_lo < d_hi ? lo : d_hi < d_lo ? hi : ((lo & 1) ? hi : lo);
        }
        if (r.bits != want && ++mismatches < 5) ADD_FAILURE() << "x=" << hex(uint32_t(b), 8) << " got " << hex(r.bits, 4) << " want " << hex(want, 4);
    }
    EXPECT_EQ(mismatches, 0u);
}

}  // namespace
}  // namespace fp8kit::test
