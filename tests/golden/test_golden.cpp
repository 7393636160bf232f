// tests/golden/test_golden.cpp: every row of ../shared/testdata/fp8_decode.tsv and fp8_encode.tsv
// (exact rational arithmetic from the OCP OFP8 rules) through the scalar functions and through
// every bulk path (f32 in/out on every ISA; bf16/f16 in/out for the rows exact in those types).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "fp8kit/convert.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

struct DecodeRow {
    uint8_t code;
    bool nan;
    uint32_t f32;  // exact value's bits (Inf as 0x7f800000 / 0xff800000)
};
struct EncodeRow {
    uint32_t f32;
    bool nan;  // any NaN code is correct
    uint8_t code;
};

uint32_t parse_hex(const std::string& s) { return uint32_t(std::stoul(s, nullptr, 16)); }

std::ifstream open_or_fail(const std::string& path) {
    std::ifstream in(path);
    if (!in) ADD_FAILURE() << "cannot open golden file " << path << " (set FP8KIT_TESTDATA_DIR)";
    return in;
}

std::map<Format, std::vector<DecodeRow>> load_decode() {
    std::map<Format, std::vector<DecodeRow>> rows;
    std::ifstream in = open_or_fail(testdata("fp8_decode.tsv"));
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ss(line);
        std::string fmt, code, value;
        ss >> fmt >> code >> value;
        const Format f = parse_format(fmt);
        DecodeRow r{uint8_t(parse_hex(code)), value == "nan", 0};
        if (value == "+inf") r.f32 = 0x7f800000u;
        else if (value == "-inf") r.f32 = 0xff800000u;
        else if (!r.nan) r.f32 = parse_hex(value);
        // The file holds exact rational values, in which -0 = 0, so code 0x80 reads 0x00000000.
        // NUMERICS.md's -0 column (and the encode vectors, -0.0 -> 0x80) fix its sign: -0.0.
        if (r.f32 == 0 && (r.code & 0x80) && format_info(f).has_neg_zero) r.f32 = 0x80000000u;
        rows[f].push_back(r);
    }
    return rows;
}

std::map<std::pair<Format, Overflow>, std::vector<EncodeRow>> load_encode() {
    std::map<std::pair<Format, Overflow>, std::vector<EncodeRow>> rows;
    std::ifstream in = open_or_fail(testdata("fp8_encode.tsv"));
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ss(line);
        std::string fmt, mode, x, code;
        ss >> fmt >> mode >> x >> code;
        const EncodeRow r{parse_hex(x), code == "nan", code == "nan" ? uint8_t(0) : uint8_t(parse_hex(code))};
        rows[{parse_format(fmt), parse_overflow(mode)}].push_back(r);
    }
    return rows;
}

TEST(Golden, DecodeEveryCodeOfEveryFormat) {
    const auto rows = load_decode();
    ASSERT_EQ(rows.size(), 5u);
    for (const auto& entry : rows) {
        const Format f = entry.first;
        const std::vector<DecodeRow>& list = entry.second;
        ASSERT_EQ(list.size(), 256u) << to_string(f);
        std::vector<uint8_t> codes;
        for (const auto& r : list) {
            const float v = decode(r.code, f);
            if (r.nan) {
                EXPECT_TRUE(v != v && is_nan(r.code, f)) << to_string(f) << " " << hex(r.code, 2);
            } else {
                EXPECT_EQ(bits(v), r.f32) << to_string(f) << " " << hex(r.code, 2);
                EXPECT_FALSE(is_nan(r.code, f));
            }
            codes.push_back(r.code);
        }
        for_each_isa([&](Isa) {
            std::vector<float> out(codes.size());
            std::vector<bf16> out_bf(codes.size());
            std::vector<f16> out_h(codes.size());
            decode(codes, out, f);
            decode(codes, std::span<bf16>(out_bf), f);
            decode(codes, std::span<f16>(out_h), f);
            for (size_t i = 0; i < list.size(); ++i) {
                const float want = from_bits(list[i].f32);
                const float got = out[i];
                if (list[i].nan) {
                    EXPECT_TRUE(got != got && float(out_bf[i]) != float(out_bf[i]) && float(out_h[i]) != float(out_h[i]));
                    continue;
                }
                EXPECT_EQ(bits(got), list[i].f32) << to_string(f) << " " << hex(list[i].code, 2);
                // bf16 holds every FP8 value exactly (e8m0fnu's extremes included).
                EXPECT_EQ(bits(float(out_bf[i])), list[i].f32) << to_string(f) << " " << hex(list[i].code, 2);
                // f16 too, except e8m0fnu outside f16's range (IEEE rounding to Inf / 0).
                EXPECT_EQ(out_h[i].bits, f16(want).bits) << to_string(f) << " " << hex(list[i].code, 2);
                if (f != Format::e8m0fnu) {
                    EXPECT_EQ(bits(float(out_h[i])), list[i].f32);
                }
            }
        });
    }
}

TEST(Golden, EncodeEveryVectorScalarAndBulk) {
    const auto rows = load_encode();
    ASSERT_EQ(rows.size(), 8u);  // four signed formats x two modes
    for (const auto& entry : rows) {
        const Format f = entry.first.first;
        const Overflow o = entry.first.second;
        const std::vector<EncodeRow>& list = entry.second;
        SCOPED_TRACE(std::string(to_string(f)) + " " + std::string(to_string(o)));
        std::vector<float> in;
        for (const auto& r : list) in.push_back(from_bits(r.f32));
        auto check = [&](uint8_t got, const EncodeRow& r, const char* path) {
            if (r.nan) {
                EXPECT_TRUE(is_nan(got, f)) << path << " x=" << hex(r.f32, 8) << " got " << hex(got, 2);
            } else {
                EXPECT_EQ(got, r.code) << path << " x=" << hex(r.f32, 8);
            }
        };
        for (size_t i = 0; i < list.size(); ++i) check(encode(in[i], f, o), list[i], "scalar");
        for_each_isa([&](Isa) {
            std::vector<uint8_t> out(in.size());
            encode(in, out, f, o);
            for (size_t i = 0; i < list.size(); ++i) check(out[i], list[i], "bulk f32");
            // The rows whose input is exact in bf16 / f16 must give the same code from those types.
            std::vector<bf16> in_bf;
            std::vector<f16> in_h;
            std::vector<const EncodeRow*> bf_rows, h_rows;
            for (const auto& r : list) {
                const float x = from_bits(r.f32);
                if (bits(float(bf16(x))) == r.f32) {
                    in_bf.push_back(bf16(x));
                    bf_rows.push_back(&r);
                }
                if (bits(float(f16(x))) == r.f32) {
                    in_h.push_back(f16(x));
                    h_rows.push_back(&r);
                }
            }
            std::vector<uint8_t> out_bf(in_bf.size()), out_h(in_h.size());
            encode(std::span<const bf16>(in_bf), out_bf, f, o);
            encode(std::span<const f16>(in_h), out_h, f, o);
            for (size_t i = 0; i < in_bf.size(); ++i) check(out_bf[i], *bf_rows[i], "bulk bf16");
            for (size_t i = 0; i < in_h.size(); ++i) check(out_h[i], *h_rows[i], "bulk f16");
            // Every FP8 value and every midpoint between neighbours is exact in bf16 and f16.
            EXPECT_GE(in_bf.size(), 256u);
            EXPECT_GE(in_h.size(), 256u);
        });
    }
}

}  // namespace
}  // namespace fp8kit::test
