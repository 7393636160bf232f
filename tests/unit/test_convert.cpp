// tests/unit/test_convert.cpp: the bulk API on every CPU path against the scalar encode()/decode():
// all 2^16 bf16 and f16 inputs, every code, random and special float32 values with scales, tails
// and unaligned spans, thread-count independence, and the errors for bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "fp8kit/convert.hpp"
#include "fp8kit/error.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

constexpr Overflow modes[] = {Overflow::saturate, Overflow::nonsaturating};

// Random float32s over the whole exponent range, plus the values where rounding is decided.
std::vector<float> interesting_floats(size_t n_random) {
    std::vector<float> v;
    std::mt19937 rng(7);
    for (size_t i = 0; i < n_random; ++i) v.push_back(from_bits(uint32_t(rng())));
    std::normal_distribution<float> normal(0.0f, 100.0f);
    for (size_t i = 0; i < n_random; ++i) v.push_back(normal(rng));
    for (Format f : all_formats) {
        for (int c = 0; c < 256; ++c) {
            const float x = decode(uint8_t(c), f);
            for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, 1e30f), x * 1.0625f, x * 0.97f}) v.push_back(y);
        }
    }
    const float inf = std::numeric_limits<float>::infinity();
    for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 464.0f, 61440.0f, 248.0f,
                    std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()}) {
        v.push_back(x);
        v.push_back(-x);
    }
    return v;
}

TEST(Convert, EncodeF32EveryPathEqualsScalar) {
    const std::vector<float> in = interesting_floats(20000);
    for (float scale : {1.0f, 0.75f, 3.0e-3f, 1024.0f}) {
        for_each_isa([&](Isa) {
            for (Format f : all_formats) {
                for (Overflow o : modes) {
                    std::vector<uint8_t> out(in.size());
                    encode(in, out, f, o, scale);
                    for (size_t i = 0; i < in.size(); ++i) {
                        ASSERT_EQ(out[i], encode(in[i] * scale, f, o))
                            << to_string(f) << " " << to_string(o) << " x=" << hex(bits(in[i]), 8) << " scale=" << scale;
                    }
                }
            }
        });
    }
}

// Every bf16 and every f16 bit pattern, every format and mode, every path.
TEST(Convert, Encode16BitInputsExhaustive) {
    std::vector<bf16> in_bf(65536);
    std::vector<f16> in_h(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
        in_bf[i] = bf16::from_bits(uint16_t(i));
        in_h[i] = f16::from_bits(uint16_t(i));
    }
    for_each_isa([&](Isa) {
        for (Format f : all_formats) {
            for (Overflow o : modes) {
                for (float scale : {1.0f, 0.375f}) {
                    std::vector<uint8_t> out_bf(65536), out_h(65536);
                    encode(std::span<const bf16>(in_bf), out_bf, f, o, scale);
                    encode(std::span<const f16>(in_h), out_h, f, o, scale);
                    for (uint32_t i = 0; i < 65536; ++i) {
                        ASSERT_EQ(out_bf[i], encode(float(in_bf[i]) * scale, f, o)) << to_string(f) << " bf16 " << hex(i, 4);
                        ASSERT_EQ(out_h[i], encode(float(in_h[i]) * scale, f, o)) << to_string(f) << " f16 " << hex(i, 4);
                    }
                }
            }
        }
    });
}

// Every code to f32, bf16 and f16, with and without a scale_inv.
TEST(Convert, DecodeEveryCodeEveryOutputType) {
    std::vector<uint8_t> codes(256 * 3);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i * 7 + i / 256);
    for_each_isa([&](Isa) {
        for (Format f : all_formats) {
            for (float scale_inv : {1.0f, 0.0078125f, 3.0f, 1.0e30f, 1.0e-30f}) {
                std::vector<float> out(codes.size());
                std::vector<bf16> out_bf(codes.size());
                std::vector<f16> out_h(codes.size());
                decode(codes, out, f, scale_inv);
                decode(codes, std::span<bf16>(out_bf), f, scale_inv);
                decode(codes, std::span<f16>(out_h), f, scale_inv);
                for (size_t i = 0; i < codes.size(); ++i) {
                    const float want = decode(codes[i], f) * scale_inv;
                    ASSERT_TRUE(same_float(out[i], want)) << to_string(f) << " " << hex(codes[i], 2);
                    ASSERT_TRUE(same_float(float(out_bf[i]), float(bf16(want)))) << to_string(f) << " " << hex(codes[i], 2);
                    ASSERT_TRUE(same_float(float(out_h[i]), float(f16(want)))) << to_string(f) << " " << hex(codes[i], 2);
                }
            }
        }
    });
}

// Lengths around the block size and unaligned starts: the tail path must touch nothing beyond n.
TEST(Convert, TailsAndUnalignedSpans) {
    const std::vector<float> src = interesting_floats(300);
    for_each_isa([&](Isa) {
        for (size_t offset : {0u, 1u, 3u}) {
            for (size_t n = 0; n <= 150; ++n) {
                std::vector<uint8_t> out(n + 8, 0xa5);
                std::span<const float> in(src.data() + offset, n);
                encode(in, std::span(out.data() + 1, n), Format::e4m3fn);
                ASSERT_EQ(out[0], 0xa5);
                for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[1 + i], encode(in[i], Format::e4m3fn));
                for (size_t i = n + 1; i < out.size(); ++i) ASSERT_EQ(out[i], 0xa5) << "wrote past the end, n=" << n;

                std::vector<float> back(n + 8, -7.0f);
                decode(std::span<const uint8_t>(out.data() + 1, n), std::span(back.data() + 1, n), Format::e4m3fn);
                ASSERT_EQ(back[0], -7.0f);
                for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same_float(back[1 + i], decode(out[1 + i], Format::e4m3fn)));
                for (size_t i = n + 1; i < back.size(); ++i) ASSERT_EQ(back[i], -7.0f) << "wrote past the end, n=" << n;
            }
        }
    });
}

// Large inputs are split over threads; the bytes must not depend on how many.
TEST(Convert, ThreadCountDoesNotChangeResults) {
    const size_t n = (size_t(1) << 20) + 37;
    std::vector<float> in(n);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 300.0f);
    for (float& x : in) x = normal(rng);
    const int saved = num_threads();
    std::vector<uint8_t> one(n), many(n);
    set_num_threads(1);
    encode(in, one, Format::e5m2, Overflow::nonsaturating, 0.5f);
    set_num_threads(3);
    encode(in, many, Format::e5m2, Overflow::nonsaturating, 0.5f);
    set_num_threads(saved);
    EXPECT_EQ(one, many);
    for (size_t i = 0; i < n; i += 997) ASSERT_EQ(one[i], encode(in[i] * 0.5f, Format::e5m2, Overflow::nonsaturating));
}

// Outputs of 4 MiB and more per call are written with non-temporal stores after an aligning head:
// check that path against the scalar functions, from unaligned output pointers, with a guard
// after the end. One thread, so the call is not split below the threshold.
TEST(Convert, LargeOutputsStreamedExactly) {
    const int saved = num_threads();
    set_num_threads(1);
    const size_t n = (size_t(4) << 20) + 77;  // >= 4 MiB of FP8 codes, not a block multiple
    std::vector<float> in(n);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 200.0f);
    for (float& x : in) x = normal(rng);
    for_each_isa([&](Isa) {
        for (size_t offset : {0u, 1u, 3u}) {
            std::vector<uint8_t> codes(n + offset + 64, 0xa5);
            std::span<uint8_t> out(codes.data() + offset, n);
            encode(in, out, Format::e4m3fn, Overflow::saturate, 0.5f);
            for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], encode(in[i] * 0.5f, Format::e4m3fn)) << "i=" << i;
            for (size_t i = offset + n; i < codes.size(); ++i) ASSERT_EQ(codes[i], 0xa5) << "wrote past the end";
            for (size_t i = 0; i < offset; ++i) ASSERT_EQ(codes[i], 0xa5) << "wrote before the start";

            // Decode 1.1 Mi codes to f32 (4.4 MiB), 2.2 Mi to bf16 and f16, into unaligned spans.
            const size_t m = (size_t(11) << 20) / 10;
            std::vector<float> back(m + offset + 16, -7.0f);
            decode(std::span<const uint8_t>(out.data(), m), std::span(back.data() + offset, m), Format::e4m3fn, 2.0f);
            for (size_t i = 0; i < m; ++i) ASSERT_TRUE(same_float(back[offset + i], decode(out[i], Format::e4m3fn) * 2.0f));
            for (size_t i = offset + m; i < back.size(); ++i) ASSERT_EQ(back[i], -7.0f) << "wrote past the end";
            std::vector<bf16> back16(2 * m + offset + 16, bf16::from_bits(0x1234));
            std::vector<uint8_t> codes2(2 * m);
            for (size_t i = 0; i < 2 * m; ++i) codes2[i] = out[i % n];
            decode(codes2, std::span(back16.data() + offset, 2 * m), Format::e4m3fn);
            for (size_t i = 0; i < 2 * m; ++i) ASSERT_EQ(back16[offset + i].bits, decode_bf16(codes2[i], Format::e4m3fn).bits);
            for (size_t i = offset + 2 * m; i < back16.size(); ++i) ASSERT_EQ(back16[i].bits, 0x1234) << "wrote past the end";
            std::vector<f16> backh(2 * m + offset + 16, f16::from_bits(0x1234));
            decode(codes2, std::span(backh.data() + offset, 2 * m), Format::e5m2, 0.25f);
            for (size_t i = 0; i < 2 * m; ++i) {
                ASSERT_EQ(backh[offset + i].bits, f16(decode(codes2[i], Format::e5m2) * 0.25f).bits);
            }
            for (size_t i = offset + 2 * m; i < backh.size(); ++i) ASSERT_EQ(backh[i].bits, 0x1234) << "wrote past the end";
        }
    });
    set_num_threads(saved);
}

TEST(Convert, MismatchedSpansAreClearErrors) {
    std::vector<float> in(8);
    std::vector<uint8_t> out(7);
    try {
        encode(in, out, Format::e4m3fn);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "fp8kit::encode: out.size() is 7, expected in.size() = 8");
    }
    std::vector<uint8_t> codes(5);
    std::vector<bf16> wide(6);
    EXPECT_THROW(decode(codes, std::span<bf16>(wide), Format::e5m2), Error);
    EXPECT_THROW(encode_stochastic(in, out, Format::e5m2, {1, 0}), Error);
    std::vector<uint8_t> out8(8);
    try {
        encode_stochastic(in, out8, Format::e8m0fnu, {1, 0});
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("e8m0fnu"), std::string::npos) << e.what();
    }
    EXPECT_THROW(set_num_threads(0), Error);
}

}  // namespace
}  // namespace fp8kit::test
