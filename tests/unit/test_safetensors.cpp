// tests/unit/test_safetensors.cpp: the safetensors reader and writer against the format's byte-level
// spec: files written here byte by byte read back right, the writer's bytes are exactly the spec's
// layout, every dtype round-trips bit for bit, and each malformed header gives an fp8kit::Error
// naming the file and the problem. (Interop with the Python package and PyTorch:
// tests/golden/test_safetensors_py.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "fp8kit/safetensors.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("fp8kit_st_" + std::to_string(std::random_device{}()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

    // A file of an 8-byte little-endian length, the header text, then `data`.
    std::string write_raw(const std::string& name, const std::string& header, const std::vector<uint8_t>& data,
                          uint64_t length_field) const {
        std::string bytes;
        for (int i = 0; i < 8; ++i) bytes.push_back(char(uint8_t(length_field >> (8 * i))));
        bytes += header;
        bytes.append(data.begin(), data.end());
        const std::string p = path(name);
        std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
        return p;
    }
    std::string write_file(const std::string& name, const std::string& header, const std::vector<uint8_t>& data = {}) const {
        return write_raw(name, header, data, header.size());
    }
    static std::string read_all(const std::string& p) {
        std::ifstream in(p, std::ios::binary);
        return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    }
    // Opening p fails with an fp8kit::Error that names the file and contains `needle`.
    static void expect_bad(const std::string& p, const std::string& needle) {
        SCOPED_TRACE(needle);
        expect_error([&] { SafetensorsFile f(p); }, needle);
        expect_error([&] { SafetensorsFile f(p); }, p);
    }

    fs::path dir_;
};

const DType every_dtype[] = {DType::e4m3fn, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz, DType::e8m0fnu,
                             DType::bf16,   DType::f16,  DType::f32,      DType::f64,      DType::i8,
                             DType::i16,    DType::i32,  DType::i64,      DType::u8,       DType::u16,
                             DType::u32,    DType::u64,  DType::boolean};

TEST_F(Safetensors, DTypeNamesAreTheSpecsNames) {
    const std::pair<DType, const char*> names[] = {
        {DType::e4m3fn, "F8_E4M3"}, {DType::e5m2, "F8_E5M2"}, {DType::e4m3fnuz, "F8_E4M3FNUZ"},
        {DType::e5m2fnuz, "F8_E5M2FNUZ"}, {DType::e8m0fnu, "F8_E8M0"}, {DType::bf16, "BF16"},
        {DType::f16, "F16"}, {DType::f32, "F32"}, {DType::f64, "F64"}, {DType::i8, "I8"},
        {DType::i16, "I16"}, {DType::i32, "I32"}, {DType::i64, "I64"}, {DType::u8, "U8"},
        {DType::u16, "U16"}, {DType::u32, "U32"}, {DType::u64, "U64"}, {DType::boolean, "BOOL"}};
    for (const auto& [d, n] : names) {
        EXPECT_EQ(safetensors_dtype_name(d), n);
        EXPECT_EQ(parse_safetensors_dtype(n), d);
    }
    EXPECT_FALSE(parse_safetensors_dtype("f32").has_value());
    EXPECT_FALSE(parse_safetensors_dtype("F8_E4M3FN").has_value());
}

// Every dtype, shapes from scalar to 3-d and empty, random bytes: what is read back is bit for bit
// what was written, in the same order, with the metadata.
TEST_F(Safetensors, EveryDTypeRoundTripsBitForBit) {
    std::mt19937 rng(7);
    std::vector<std::pair<std::string, Tensor>> tensors;
    const Shape shapes[] = {{}, {5}, {3, 7}, {2, 0, 4}, {2, 3, 5}};
    int k = 0;
    for (DType d : every_dtype) {
        const Shape& s = shapes[size_t(k++) % std::size(shapes)];
        Tensor t = Tensor::empty(s, d);
        auto* b = static_cast<uint8_t*>(t.raw_data());
        for (size_t i = 0; i < t.nbytes(); ++i) b[i] = uint8_t(d == DType::boolean ? rng() % 2 : rng());
        tensors.emplace_back("layer." + std::string(safetensors_dtype_name(d)), t);
    }
    const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "\xc3\xa9t\xc3\xa9 \"q\""}};
    const std::string p = path("all.safetensors");
    save_safetensors(p, tensors, meta);

    const SafetensorsFile f(p);
    ASSERT_EQ(f.names().size(), tensors.size());
    EXPECT_EQ(f.metadata(), meta);
    EXPECT_EQ(f.data_offset() % 8, 0u);
    for (size_t i = 0; i < tensors.size(); ++i) {
        const auto& [name, t] = tensors[i];
        SCOPED_TRACE(name);
        EXPECT_EQ(f.names()[i], name);
        EXPECT_TRUE(f.contains(name));
        const Tensor r = f.tensor(name);
        EXPECT_EQ(r.dtype(), t.dtype());
        EXPECT_EQ(r.shape(), t.shape());
        ASSERT_EQ(r.nbytes(), t.nbytes());
        EXPECT_EQ(std::memcmp(r.const_raw_data(), t.const_raw_data(), t.nbytes()), 0);
        EXPECT_EQ(f.entry(name).end - f.entry(name).begin, t.nbytes());
    }
    EXPECT_FALSE(f.contains("nope"));
    expect_error([&] { (void)f.tensor("nope"); }, "no tensor named 'nope'");
}

// The writer's bytes are the spec's layout exactly: length, compact JSON in the given order padded
// with spaces to a multiple of 8, then the data little-endian, row-major (a transposed view too).
TEST_F(Safetensors, WriterBytesAreTheSpecLayout) {
    const Tensor m = Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    const std::string p = path("w.safetensors");
    save_safetensors(p, {{"z", Tensor::from(std::vector<int16_t>{-2}, {1})}, {"mt", m.transpose()}}, {{"k", "v"}});
    const std::string json =
        R"({"__metadata__":{"k":"v"},"z":{"dtype":"I16","shape":[1],"data_offsets":[0,2]},)"
        R"("mt":{"dtype":"F32","shape":[3,2],"data_offsets":[2,26]}})";
    std::string header = json + std::string((8 - json.size() % 8) % 8, ' ');
    std::string expect;
    for (int i = 0; i < 8; ++i) expect.push_back(char(uint8_t(uint64_t(header.size()) >> (8 * i))));
    expect += header;
    expect += std::string("\xfe\xff", 2);  // int16 -2
    for (float v : {1.f, 4.f, 2.f, 5.f, 3.f, 6.f}) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        for (int i = 0; i < 4; ++i) expect.push_back(char(uint8_t(u >> (8 * i))));
    }
    EXPECT_EQ(read_all(p), expect);
}

// A file composed byte by byte: a header length that puts the data 2 bytes past a multiple of 4
// (the F16 is aligned and read in place, the I32 lands misaligned and is copied),
// names in file order (not sorted), f16 / i32 / BOOL values, metadata.
TEST_F(Safetensors, HandWrittenFileReadsBack) {
    std::string header =
        R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"a":{"dtype":"I32","shape":[1,1],)"
        R"("data_offsets":[4,8]},"__metadata__":{"k":"v"},"e":{"dtype":"BOOL","shape":[0],"data_offsets":[8,8]},)"
        R"("c":{"dtype":"F8_E4M3","shape":[],"data_offsets":[8,9]}})" + std::string(" ");
    header.append((4 + 2 - (8 + header.size()) % 4) % 4, ' ');  // trailing spaces are valid JSON
    ASSERT_EQ((8 + header.size()) % 4, 2u);
    const std::vector<uint8_t> data = {0x00, 0x3c, 0x00, 0xc0,   // f16 1.0, -2.0
                                       0xfb, 0xff, 0xff, 0xff,   // i32 -5
                                       0x38};                    // e4m3fn 1.0
    const std::string p = write_file("hand.safetensors", header, data);
    const SafetensorsFile f(p);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"b", "a", "e", "c"}));
    EXPECT_EQ(f.metadata().at("k"), "v");
    EXPECT_EQ(f.data_offset(), 8 + header.size());
    const Tensor b = f.tensor("b");
    EXPECT_EQ(b.get({0}), 1.0f);
    EXPECT_EQ(b.get({1}), -2.0f);
    // A view: the same memory every time (a copy would differ).
    EXPECT_EQ(f.tensor("b").const_raw_data(), b.const_raw_data());
    const Tensor a = f.tensor("a");
    EXPECT_EQ(a.shape(), (Shape{1, 1}));
    EXPECT_EQ(a.at<int32_t>({0, 0}), -5);
    EXPECT_NE(f.tensor("a").const_raw_data(), a.const_raw_data());  // misaligned: a fresh copy each time
    EXPECT_EQ(f.tensor("e").numel(), 0);
    EXPECT_EQ(f.tensor("e").dtype(), DType::boolean);
    const Tensor c = f.tensor("c");
    EXPECT_EQ(c.dim(), 0);
    EXPECT_EQ(c.get({}), 1.0f);
}

// The spec orders the data by offsets, not by the header: a header listing the later bytes first
// is valid (as the reference implementation reads it), names stay in header order.
TEST_F(Safetensors, HeaderOrderNeedNotBeDataOrder) {
    const std::string p = write_file("order.safetensors",
                                     R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[2,5]},)"
                                     R"("a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})",
                                     {0x80, 0x3f, 7, 8, 9});  // bf16 1.0, then u8 7 8 9
    const SafetensorsFile f(p);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"b", "a"}));
    EXPECT_EQ(f.tensor("a").get({0}), 1.0f);
    EXPECT_EQ(f.tensor("b").at<const uint8_t>({2}), 9);
}

TEST_F(Safetensors, TensorsOutliveTheFileObject) {
    const std::string p = path("life.safetensors");
    save_safetensors(p, {{"x", Tensor::from(std::vector<float>{3, 4}, {2})}});
    Tensor t;
    {
        const SafetensorsFile f(p);
        t = f.tensor("x");
    }
    EXPECT_EQ(t.get({1}), 4.0f);
}

TEST_F(Safetensors, EmptyFileAndEmptyHeader) {
    const std::string p = write_file("empty.safetensors", "{}");
    const SafetensorsFile f(p);
    EXPECT_TRUE(f.names().empty());
    EXPECT_TRUE(f.metadata().empty());
}

TEST_F(Safetensors, MalformedFilesAreRefusedWithTheReason) {
    const std::string ok = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    const std::vector<uint8_t> d8(8, 0);
    {
        const std::string p = path("short.safetensors");
        std::ofstream(p, std::ios::binary).write("\x05\x00\x00", 3);
        expect_bad(p, "too short for the 8-byte header length");
    }
    expect_bad(write_raw("past.safetensors", ok, d8, ok.size() + 9), "runs past the end of the file");
    expect_bad(write_raw("huge.safetensors", ok, d8, 100'000'001), "over the limit");
    expect_bad(write_raw("hugest.safetensors", ok, d8, UINT64_MAX), "over the limit");
    expect_bad(write_file("json.safetensors", R"({"x":{"dtype":"F32",)", d8), "not valid JSON");
    expect_bad(write_file("utf8.safetensors", "{\"\xff\":{}}", d8), "not valid JSON");
    expect_bad(write_file("array.safetensors", "[1,2]", d8), "expected an object");
    expect_bad(write_file("dtype.safetensors", R"({"x":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", d8),
               "unknown dtype \"F7\"");
    expect_bad(write_file("oob.safetensors", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8),
               "out of bounds");
    expect_bad(write_file("overlap.safetensors",
                          R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8),
               "'x' and 'y' overlap");
    expect_bad(write_file("gap.safetensors", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8),
               "gap in the data section");
    expect_bad(write_file("trail.safetensors", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8),
               "trailing bytes");
    expect_bad(write_file("count.safetensors", R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", d8),
               "needs 4");
    expect_bad(write_file("overflow.safetensors",
                          R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8),
               "overflows 64 bits");
    expect_bad(write_file("dup.safetensors",
                          R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8),
               "key 'x' twice");
    expect_bad(write_file("dupfield.safetensors",
                          R"({"x":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", d8),
               "key 'dtype' twice");
    expect_bad(write_file("neg.safetensors", R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
               "expected a non-negative integer");
    expect_bad(write_file("frac.safetensors", R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8),
               "expected a non-negative integer");
    expect_bad(write_file("noshape.safetensors", R"({"x":{"dtype":"F32","data_offsets":[0,8]}})", d8),
               "has no 'shape'");
    expect_bad(write_file("extra.safetensors",
                          R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"q":1}})", d8),
               "unknown field 'q'");
    expect_bad(write_file("backwards.safetensors", R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d8),
               "end before they begin");
    expect_bad(write_file("offs.safetensors", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8),
               "expected [begin, end]");
    expect_bad(write_file("meta.safetensors", R"({"__metadata__":{"a":1}})"), "expected a string");
    expect_bad(write_file("entry.safetensors", R"({"x":[1]})"), "tensor 'x' is array, expected an object");
    expect_bad(write_file("deep.safetensors", std::string(40, '[') + std::string(40, ']')), "nests deeper");
    // A value or a parser's excerpt of a megabyte is shown cut to its start and its length.
    for (const auto& [name, header, needle] :
         {std::tuple{"long_dtype.safetensors", R"({"x":{"dtype":")" + std::string(1000000, 'A') + R"(","shape":[2],"data_offsets":[0,8]}})",
                     "unknown dtype \"AAAA"},
          std::tuple{"long_text.safetensors", "{\"" + std::string(1000000, 'A'), "not valid JSON"}}) {
        const std::string p = write_file(name, header, d8);
        expect_bad(p, needle);
        expect_bad(p, " bytes)");
        try {
            SafetensorsFile f(p);
        } catch (const Error& e) {
            EXPECT_LT(std::string(e.what()).size(), 1000u) << name;
        }
    }
    expect_error([&] { SafetensorsFile f(path("absent.safetensors")); }, "absent.safetensors");
    // NUL padding (JSON has no NUL; the safetensors package refuses it), while spaces pass.
    expect_bad(write_file("nul_padded.safetensors", ok + std::string(3, '\0'), d8), "header holds a NUL byte at offset " + std::to_string(ok.size()));
    EXPECT_EQ(SafetensorsFile(write_file("spaces.safetensors", ok + "   ", d8)).names().size(), 1u);
    // A name holding escape sequences is shown escaped in the message, never raw.
    const std::string esc = write_file("esc.safetensors", "{\"a\\u001b[2J\\u009b\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,8]}}", d8);
    expect_bad(esc, "tensor 'a\\x1b[2J\\xc2\\x9b' has an unknown dtype");
    // (FIFOs, devices and directories as inputs: tests/e2e/hostile_inputs.py; making one here would need an OS header.)
    expect_bad(dir_.string(), "not a regular file");
}

TEST_F(Safetensors, WriterRefusesBadInputAndLeavesNoFile) {
    const std::string p = path("bad.safetensors");
    const Tensor x = Tensor::zeros({2}, DType::f32);
    expect_error([&] { save_safetensors(p, {{"x", x}, {"x", x}}); }, "'x' appears twice");
    expect_error([&] { save_safetensors(p, {{"__metadata__", x}}); }, "reserved");
    expect_error([&] { save_safetensors(p, {{"u", Tensor()}}); }, "undefined");
    expect_error([&] { save_safetensors(p, {{"\xff", x}}); }, "not valid UTF-8");
    EXPECT_FALSE(fs::exists(p));
    // An existing file stays as it was when a new write fails.
    save_safetensors(p, {{"x", x}});
    const std::string before = read_all(p);
    expect_error([&] { save_safetensors(p, {{"y", x}, {"y", x}}); }, "twice");
    EXPECT_EQ(read_all(p), before);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // no temporaries
}

}  // namespace
}  // namespace fp8kit::test
