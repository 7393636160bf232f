// tests/unit/test_tensor.cpp: the Tensor model - construction (shape, row-major strides, sizes,
// 64-byte alignment), dtype names, typed access checks, views that share storage (reshape, slice,
// transpose), copies (contiguous, clone), element get/set for every dtype, and the errors for bad
// indices and shapes. Expected values are written out by hand (strides, offsets, FP8 codes derived
// from the bit layouts of NUMERICS.md), never taken from the code under test. Also the CPU memory
// behind tensors (src/core/host_memory.cpp): a freed large block is reused, never while alive,
// zeros() clears a reused one, and the blocks kept stay within host_cache_cap; a kernel's scratch
// block released is the next one its thread gets for that size, also when its list is full.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/host_memory.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/tensor.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// A [rows, cols] f32 tensor with element (i, j) = 100 i + j: every element is distinct and its
// value says where it came from.
Tensor iota2(int64_t rows, int64_t cols) {
    std::vector<float> v(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) v[size_t(i * cols + j)] = float(100 * i + j);
    }
    return Tensor::from(v, {rows, cols});
}

const DType all_dtypes[] = {DType::e4m3fn, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz, DType::e8m0fnu,
                            DType::f32,    DType::bf16, DType::f16,      DType::u8,       DType::i32,
                            DType::f64,    DType::i8,   DType::i16,      DType::i64,      DType::u16,
                            DType::u32,    DType::u64,  DType::boolean};

TEST(Tensor, EmptyHasShapeRowMajorStridesSizeAndAlignment) {
    for (DType d : all_dtypes) {
        SCOPED_TRACE(std::string(to_string(d)));
        const Tensor t = Tensor::empty({2, 3, 5}, d);
        EXPECT_TRUE(t.defined());
        EXPECT_EQ(t.dtype(), d);
        EXPECT_EQ(t.device(), Device::cpu);
        EXPECT_EQ(t.shape(), (Shape{2, 3, 5}));
        EXPECT_EQ(t.strides(), (Shape{15, 5, 1}));
        EXPECT_EQ(t.dim(), 3);
        EXPECT_EQ(t.numel(), 30);
        EXPECT_EQ(t.size(0), 2);
        EXPECT_EQ(t.size(-1), 5);
        EXPECT_EQ(t.size(-3), 2);
        EXPECT_TRUE(t.is_contiguous());
        EXPECT_EQ(t.storage_offset(), 0);
        const size_t elem = (d == DType::f64 || d == DType::i64 || d == DType::u64)   ? 8
                            : (d == DType::f32 || d == DType::i32 || d == DType::u32) ? 4
                            : (d == DType::bf16 || d == DType::f16 || d == DType::i16 || d == DType::u16) ? 2
                                                                                                          : 1;
        EXPECT_EQ(t.nbytes(), 30 * elem);
        EXPECT_TRUE(aligned64(t.raw_data()));
    }
    // Size of every element type, against the C++ types that hold them.
    EXPECT_EQ(dtype_size(DType::f32), sizeof(float));
    EXPECT_EQ(dtype_size(DType::i32), sizeof(int32_t));
    EXPECT_EQ(dtype_size(DType::bf16), sizeof(bf16));
    EXPECT_EQ(dtype_size(DType::f16), sizeof(f16));
    EXPECT_EQ(dtype_size(DType::e4m3fn), 1u);
    EXPECT_EQ(dtype_size(DType::f64), sizeof(double));
    EXPECT_EQ(dtype_size(DType::i8), sizeof(int8_t));
    EXPECT_EQ(dtype_size(DType::i16), sizeof(int16_t));
    EXPECT_EQ(dtype_size(DType::i64), sizeof(int64_t));
    EXPECT_EQ(dtype_size(DType::u16), sizeof(uint16_t));
    EXPECT_EQ(dtype_size(DType::u32), sizeof(uint32_t));
    EXPECT_EQ(dtype_size(DType::u64), sizeof(uint64_t));
    EXPECT_EQ(dtype_size(DType::boolean), sizeof(bool));
    // Many allocations of odd sizes: every data pointer is 64-byte aligned.
    for (int64_t n = 1; n < 200; n += 7) {
        EXPECT_TRUE(aligned64(Tensor::empty({n}, DType::u8).raw_data())) << n;
        EXPECT_TRUE(aligned64(Tensor::empty({n, 3}, DType::bf16).raw_data())) << n;
    }
    // Zero-sized tensors are still defined, with no elements.
    const Tensor z = Tensor::empty({0, 5}, DType::f32);
    EXPECT_TRUE(z.defined());
    EXPECT_EQ(z.numel(), 0);
    EXPECT_EQ(z.nbytes(), 0u);
    // A 0-d tensor holds one element.
    const Tensor s = Tensor::zeros({}, DType::f32);
    EXPECT_EQ(s.numel(), 1);
    EXPECT_EQ(s.get({}), 0.0f);
    // Undefined tensor.
    const Tensor u;
    EXPECT_FALSE(u.defined());
    EXPECT_EQ(u.numel(), 0);
    expect_error([&] { (void)u.data<float>(); }, "undefined");
}

TEST(Tensor, ZerosAreZeroForEveryDtype) {
    for (DType d : all_dtypes) {
        SCOPED_TRACE(std::string(to_string(d)));
        const Tensor t = Tensor::zeros({7, 9}, d);
        const auto* p = static_cast<const unsigned char*>(t.raw_data());
        for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(p[i], 0) << i;
        EXPECT_TRUE(aligned64(t.raw_data()));
    }
}

// fill_zero zeroes every byte of a filled tensor in place (the storage shared by its views) and
// refuses what it cannot zero whole: a strided view, read-only memory.
TEST(Tensor, FillZeroZeroesInPlaceOrRefuses) {
    const std::vector<float> v{1.0f, -2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
    const Tensor t = Tensor::from(v, {2, 3});
    const Tensor view = t.reshape({3, 2});
    view.fill_zero();
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(t.data<const float>()[i]), 0u) << i;
    expect_error([&] { t.transpose().fill_zero(); }, "is not contiguous");
    expect_error([&] { Tensor::view_of(nullptr, v.data(), {6}, DType::f32).fill_zero(); }, "read-only");
}

TEST(Tensor, FromCopiesValuesWithTheMatchingDtype) {
    const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
    Tensor t = Tensor::from(f, {2, 3});
    EXPECT_EQ(t.dtype(), DType::f32);
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(t.strides(), (Shape{3, 1}));
    EXPECT_EQ(t.nbytes(), 24u);
    EXPECT_TRUE(aligned64(t.raw_data()));
    for (int64_t i = 0; i < 2; ++i) {
        for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(t.get({i, j}), f[size_t(i * 3 + j)]);
    }
    // A copy, not a view of the vector.
    EXPECT_NE(static_cast<const void*>(t.data<float>()), static_cast<const void*>(f.data()));

    const std::vector<int32_t> iv = {-7, 0, 123456};
    EXPECT_EQ(Tensor::from(iv, {3}).dtype(), DType::i32);
    EXPECT_EQ(Tensor::from(iv, {3}).get({2}), 123456.0f);
    const std::vector<uint8_t> uv = {0, 255};
    EXPECT_EQ(Tensor::from(uv, {2}).dtype(), DType::u8);
    EXPECT_EQ(Tensor::from(uv, {2}).get({1}), 255.0f);
    const std::vector<bf16> bv = {bf16::from_bits(0x3fc0)};  // 1.5
    EXPECT_EQ(Tensor::from(bv, {1, 1}).dtype(), DType::bf16);
    EXPECT_EQ(Tensor::from(bv, {1, 1}).get({0, 0}), 1.5f);
    const std::vector<f16> hv = {f16::from_bits(0xc500)};  // -5
    EXPECT_EQ(Tensor::from(hv, {1}).dtype(), DType::f16);
    EXPECT_EQ(Tensor::from(hv, {1}).get({0}), -5.0f);

    expect_error([&] { (void)Tensor::from(f, {4, 2}); }, "expected 8");
    expect_error([&] { (void)Tensor::empty({3, -1}, DType::f32); }, "negative dimension");
    // 2^58 x 16 f32 is 2^64 bytes: the product wraps to 0 in size_t and 64 bytes would be allocated
    expect_error([&] { (void)Tensor::empty({int64_t(1) << 58, 16}, DType::f32); }, "takes more than 2^62 bytes");
    expect_error([&] { (void)Tensor::empty({int64_t(1) << 31, int64_t(1) << 31, 2}, DType::f32); }, "more than 2^62");
    EXPECT_EQ(Tensor::empty({int64_t(1) << 62, 0}, DType::f32).numel(), 0);  // empty: no bytes, whatever else
}

TEST(DTypeNames, ToStringAndParseRoundTrip) {
    const std::pair<DType, const char*> names[] = {
        {DType::e4m3fn, "e4m3fn"}, {DType::e5m2, "e5m2"}, {DType::e4m3fnuz, "e4m3fnuz"},
        {DType::e5m2fnuz, "e5m2fnuz"}, {DType::e8m0fnu, "e8m0fnu"}, {DType::f32, "f32"},
        {DType::bf16, "bf16"}, {DType::f16, "f16"}, {DType::u8, "u8"}, {DType::i32, "i32"},
        {DType::f64, "f64"}, {DType::i8, "i8"}, {DType::i16, "i16"}, {DType::i64, "i64"},
        {DType::u16, "u16"}, {DType::u32, "u32"}, {DType::u64, "u64"}, {DType::boolean, "bool"}};
    for (const auto& [d, name] : names) {
        EXPECT_EQ(to_string(d), name);
        EXPECT_EQ(parse_dtype(name), d);
        EXPECT_EQ(try_parse_dtype(name), d);
    }
    EXPECT_EQ(parse_dtype("float32"), DType::f32);
    EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
    EXPECT_EQ(parse_dtype("float16"), DType::f16);
    EXPECT_EQ(parse_dtype("float64"), DType::f64);
    EXPECT_EQ(parse_dtype("e4m3"), DType::e4m3fn);
    EXPECT_FALSE(try_parse_dtype("f128").has_value());
    EXPECT_FALSE(try_parse_dtype("").has_value());
    expect_error([] { (void)parse_dtype("f128"); }, "'f128'");
    expect_error([] { (void)parse_dtype("F32"); }, "'F32'");
    // FP8 dtypes and formats convert by a cast.
    EXPECT_EQ(format_of(DType::e5m2fnuz), Format::e5m2fnuz);
    EXPECT_EQ(dtype_of(Format::e4m3fnuz), DType::e4m3fnuz);
    EXPECT_TRUE(is_fp8(DType::e8m0fnu));
    EXPECT_FALSE(is_fp8(DType::f32));
    expect_error([] { (void)format_of(DType::bf16); }, "bf16");
}

TEST(Tensor, TypedAccessChecksTheElementType) {
    const Tensor f = Tensor::zeros({4}, DType::f32);
    EXPECT_NO_THROW((void)f.data<float>());
    expect_error([&] { (void)f.data<int32_t>(); }, "f32");
    expect_error([&] { (void)f.data<uint8_t>(); }, "f32");
    expect_error([&] { (void)f.data<bf16>(); }, "f32");
    const Tensor b = Tensor::zeros({4}, DType::bf16);
    expect_error([&] { (void)b.data<f16>(); }, "bf16");
    expect_error([&] { (void)b.data<float>(); }, "bf16");
    EXPECT_NO_THROW((void)b.data<bf16>());
    const Tensor i = Tensor::zeros({4}, DType::i32);
    expect_error([&] { (void)i.data<float>(); }, "i32");
    // uint8_t holds u8 and every FP8 dtype (codes), nothing else.
    for (DType d : {DType::u8, DType::e4m3fn, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz, DType::e8m0fnu}) {
        const Tensor t = Tensor::zeros({4}, d);
        EXPECT_NO_THROW((void)t.data<uint8_t>()) << to_string(d);
        expect_error([&] { (void)t.data<float>(); }, std::string(to_string(d)));
    }
    // at<T> goes through the same check.
    expect_error([&] { (void)f.at<int32_t>({0}); }, "f32");
    f.at<float>({2}) = 9.5f;
    EXPECT_EQ(f.data<float>()[2], 9.5f);
}

TEST(TensorViews, ReshapeSharesStorageAndInfersMinusOne) {
    const Tensor x = iota2(3, 8);
    const Tensor r = x.reshape({-1, 4});
    EXPECT_EQ(r.shape(), (Shape{6, 4}));
    EXPECT_EQ(r.strides(), (Shape{4, 1}));
    EXPECT_TRUE(r.shares_storage_with(x));
    EXPECT_EQ(r.raw_data(), x.raw_data());
    // Row-major order is kept: r(k / 4, k % 4) == x(k / 8, k % 8).
    for (int64_t k = 0; k < 24; ++k) EXPECT_EQ(r.get({k / 4, k % 4}), x.get({k / 8, k % 8})) << k;
    // A write through the view is seen by the original.
    r.set({5, 3}, -1.0f);
    EXPECT_EQ(x.get({2, 7}), -1.0f);

    EXPECT_EQ(x.reshape({2, -1, 3}).shape(), (Shape{2, 4, 3}));
    EXPECT_EQ(x.reshape({2, -1, 3}).strides(), (Shape{12, 3, 1}));
    EXPECT_EQ(x.reshape({24}).shape(), (Shape{24}));
    EXPECT_EQ(x.reshape({-1}).shape(), (Shape{24}));

    expect_error([&] { (void)x.reshape({5, 5}); }, "does not hold");
    expect_error([&] { (void)x.reshape({-1, 5}); }, "does not hold");
    expect_error([&] { (void)x.reshape({-1, -1}); }, "bad shape");
    expect_error([&] { (void)x.reshape({-2, 12}); }, "bad shape");
    // Not contiguous: no view possible.
    expect_error([&] { (void)x.transpose().reshape({24}); }, "not contiguous");
}

TEST(TensorViews, SliceAlongRowsIsContiguousAlongColumnsIsStrided) {
    const Tensor x = iota2(5, 8);
    const Tensor rows = x.slice(0, 1, 4);
    EXPECT_EQ(rows.shape(), (Shape{3, 8}));
    EXPECT_EQ(rows.strides(), (Shape{8, 1}));
    EXPECT_EQ(rows.storage_offset(), 8);
    EXPECT_TRUE(rows.is_contiguous());
    EXPECT_TRUE(rows.shares_storage_with(x));
    EXPECT_EQ(rows.raw_data(), static_cast<void*>(x.data<float>() + 8));
    for (int64_t i = 0; i < 3; ++i) {
        for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(rows.get({i, j}), float(100 * (i + 1) + j));
    }

    const Tensor cols = x.slice(1, 2, 5);
    EXPECT_EQ(cols.shape(), (Shape{5, 3}));
    EXPECT_EQ(cols.strides(), (Shape{8, 1}));
    EXPECT_EQ(cols.storage_offset(), 2);
    EXPECT_FALSE(cols.is_contiguous());
    EXPECT_TRUE(cols.shares_storage_with(x));
    for (int64_t i = 0; i < 5; ++i) {
        for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(cols.get({i, j}), float(100 * i + j + 2));
    }
    cols.set({4, 2}, -3.0f);
    EXPECT_EQ(x.get({4, 4}), -3.0f);

    // Negative dimension counts from the end; a slice of a slice adds the offsets.
    const Tensor both = x.slice(-1, 2, 5).slice(0, 1, 3);
    EXPECT_EQ(both.shape(), (Shape{2, 3}));
    EXPECT_EQ(both.storage_offset(), 10);
    EXPECT_EQ(both.get({1, 0}), 202.0f);
    // A single row is contiguous; a single column of a wider matrix is not.
    EXPECT_TRUE(x.slice(0, 2, 3).is_contiguous());
    EXPECT_FALSE(x.slice(1, 2, 3).is_contiguous());
    // Empty slices are allowed.
    EXPECT_EQ(x.slice(1, 3, 3).numel(), 0);

    expect_error([&] { (void)x.slice(1, 5, 9); }, "not a range");
    expect_error([&] { (void)x.slice(0, 3, 2); }, "not a range");
    expect_error([&] { (void)x.slice(0, -1, 2); }, "not a range");
    expect_error([&] { (void)x.slice(2, 0, 1); }, "dimension 2");
}

TEST(TensorViews, TransposeSwapsShapeAndStrides) {
    const Tensor x = iota2(3, 7);
    const Tensor t = x.transpose();
    EXPECT_EQ(t.shape(), (Shape{7, 3}));
    EXPECT_EQ(t.strides(), (Shape{1, 7}));
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_TRUE(t.shares_storage_with(x));
    for (int64_t i = 0; i < 7; ++i) {
        for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(t.get({i, j}), x.get({j, i}));
    }
    t.set({6, 2}, 0.5f);
    EXPECT_EQ(x.get({2, 6}), 0.5f);
    // Transposing twice gives the original layout back.
    EXPECT_TRUE(t.transpose().is_contiguous());
    EXPECT_EQ(t.transpose().strides(), (Shape{7, 1}));
    // 1xN and Nx1 transposes stay contiguous (size-1 dimensions have no meaningful stride).
    EXPECT_TRUE(iota2(1, 5).transpose().is_contiguous());

    expect_error([] { (void)Tensor::zeros({2, 3, 4}, DType::f32).transpose(); }, "2-d");
}

TEST(TensorCopies, ContiguousAndCloneCopyValues) {
    const Tensor x = iota2(6, 9);
    // Already contiguous: contiguous() is the tensor itself; clone() always copies.
    EXPECT_TRUE(x.contiguous().shares_storage_with(x));
    const Tensor c0 = x.clone();
    EXPECT_FALSE(c0.shares_storage_with(x));
    for (int64_t i = 0; i < 6; ++i) {
        for (int64_t j = 0; j < 9; ++j) EXPECT_EQ(c0.get({i, j}), x.get({i, j}));
    }
    c0.set({0, 0}, 42.0f);
    EXPECT_EQ(x.get({0, 0}), 0.0f);

    const Tensor views[] = {x.transpose(), x.slice(1, 2, 7), x.slice(0, 1, 5).slice(1, 3, 9),
                            x.transpose().slice(0, 1, 8)};
    for (const Tensor& v : views) {
        SCOPED_TRACE(to_string(v.shape()));
        ASSERT_FALSE(v.is_contiguous());
        for (const Tensor& c : {v.contiguous(), v.clone()}) {
            EXPECT_FALSE(c.shares_storage_with(x));
            EXPECT_TRUE(c.is_contiguous());
            EXPECT_EQ(c.shape(), v.shape());
            EXPECT_EQ(c.strides(), (Shape{v.shape()[1], 1}));
            EXPECT_EQ(c.storage_offset(), 0);
            EXPECT_TRUE(aligned64(c.raw_data()));
            // Element by element, and in memory order.
            const float* p = c.data<float>();
            for (int64_t i = 0; i < v.shape()[0]; ++i) {
                for (int64_t j = 0; j < v.shape()[1]; ++j) {
                    EXPECT_EQ(c.get({i, j}), v.get({i, j}));
                    EXPECT_EQ(p[i * v.shape()[1] + j], v.get({i, j}));
                }
            }
        }
    }

    // 3-d: a slice along the middle dimension.
    std::vector<float> v3(2 * 4 * 5);
    for (size_t k = 0; k < v3.size(); ++k) v3[k] = float(k);
    const Tensor t3 = Tensor::from(v3, {2, 4, 5});
    const Tensor s3 = t3.slice(1, 1, 3);
    EXPECT_EQ(s3.strides(), (Shape{20, 5, 1}));
    EXPECT_FALSE(s3.is_contiguous());
    const Tensor c3 = s3.clone();
    EXPECT_EQ(c3.strides(), (Shape{10, 5, 1}));
    for (int64_t a = 0; a < 2; ++a) {
        for (int64_t b = 0; b < 2; ++b) {
            for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(c3.get({a, b, c}), float(a * 20 + (b + 1) * 5 + c));
        }
    }

    // FP8 codes copy as bytes; 16-bit elements as 16-bit.
    for (DType d : {DType::e4m3fn, DType::bf16}) {
        const Tensor y = Tensor::zeros({4, 5}, d);
        for (int64_t i = 0; i < 4; ++i) {
            for (int64_t j = 0; j < 5; ++j) y.set({i, j}, float(i - j) * 0.5f);
        }
        const Tensor yt = y.transpose().contiguous();
        EXPECT_EQ(yt.dtype(), d);
        for (int64_t i = 0; i < 5; ++i) {
            for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(yt.get({i, j}), float(j - i) * 0.5f);
        }
    }
}

TEST(TensorElements, GetSetEveryDtype) {
    // f32: exact.
    const Tensor f = Tensor::zeros({2, 2}, DType::f32);
    f.set({1, 0}, 0.1f);
    EXPECT_EQ(f.get({1, 0}), 0.1f);
    EXPECT_EQ(f.data<float>()[2], 0.1f);

    // bf16: round to nearest even at 8 significant bits. 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    // (odd mantissa): ties to 1. 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to the
    // even 1 + 2^-6.
    const Tensor b = Tensor::zeros({3}, DType::bf16);
    b.set({0}, 1.0f + 0x1p-8f);
    b.set({1}, 1.0f + 3 * 0x1p-8f);
    b.set({2}, -2.5f);
    EXPECT_EQ(b.get({0}), 1.0f);
    EXPECT_EQ(b.get({1}), 1.0f + 0x1p-6f);
    EXPECT_EQ(b.get({2}), -2.5f);
    EXPECT_EQ(b.data<bf16>()[2].bits, 0xc020);

    // f16: 11 significant bits, same tie rule.
    const Tensor h = Tensor::zeros({3}, DType::f16);
    h.set({0}, 1.0f + 0x1p-11f);
    h.set({1}, 1.0f + 3 * 0x1p-11f);
    h.set({2}, 65504.0f);
    EXPECT_EQ(h.get({0}), 1.0f);
    EXPECT_EQ(h.get({1}), 1.0f + 0x1p-9f);
    EXPECT_EQ(h.get({2}), 65504.0f);
    EXPECT_EQ(h.data<f16>()[2].bits, 0x7bff);

    // i32 and u8: integers in range only.
    const Tensor i = Tensor::zeros({2}, DType::i32);
    i.set({0}, -7.0f);
    i.set({1}, 16777216.0f);
    EXPECT_EQ(i.data<int32_t>()[0], -7);
    EXPECT_EQ(i.get({1}), 16777216.0f);
    expect_error([&] { i.set({0}, 0.5f); }, "i32");
    expect_error([&] { i.set({0}, 3e9f); }, "i32");
    expect_error([&] { i.set({0}, NAN); }, "i32");
    const Tensor u = Tensor::zeros({2}, DType::u8);
    u.set({1}, 200.0f);
    EXPECT_EQ(u.data<uint8_t>()[1], 200);
    EXPECT_EQ(u.get({1}), 200.0f);
    expect_error([&] { u.set({0}, 256.0f); }, "u8");
    expect_error([&] { u.set({0}, -1.0f); }, "u8");
    expect_error([&] { u.set({0}, 1.5f); }, "u8");
    EXPECT_EQ(u.data<uint8_t>()[0], 0);  // a refused set leaves the element alone

    // FP8: set encodes (nearest even, saturating), get decodes. Codes from the bit layouts:
    struct Case {
        DType d;
        float in;
        uint8_t code;
        float out;
    };
    const Case cases[] = {
        // e4m3fn, bias 7: 1.0 = 0.0111.000; 1 + 2^-4 ties to 1.0 (even); 1 + 3 * 2^-4 ties to 1.25.
        {DType::e4m3fn, 1.0f, 0x38, 1.0f},
        {DType::e4m3fn, 1.0625f, 0x38, 1.0f},
        {DType::e4m3fn, 1.1875f, 0x3a, 1.25f},
        // -0.3 = -1.2 * 2^-2: nearest on the 2^-5 grid is 0.3125 = 1.25 * 2^-2 -> 1.0101.010.
        {DType::e4m3fn, -0.3f, 0xaa, -0.3125f},
        // 500 > 448 saturates to max 0.1111.110.
        {DType::e4m3fn, 500.0f, 0x7e, 448.0f},
        {DType::e4m3fn, -1e30f, 0xfe, -448.0f},
        // Subnormal: 2^-9 is code 1.
        {DType::e4m3fn, 0x1p-9f, 0x01, 0x1p-9f},
        // e5m2, bias 15: 3 = 1.5 * 2 -> 0.10000.10; max 57344 = 0.11110.11.
        {DType::e5m2, 3.0f, 0x42, 3.0f},
        {DType::e5m2, 1e6f, 0x7b, 57344.0f},
        // e4m3fnuz, bias 8: 1.0 = 0.1000.000; -0 has no code of its own: 0x00.
        {DType::e4m3fnuz, 1.0f, 0x40, 1.0f},
        {DType::e4m3fnuz, -0.0f, 0x00, 0.0f},
        {DType::e4m3fnuz, 300.0f, 0x7f, 240.0f},
        // e5m2fnuz, bias 16: 1.0 = 0.10000.00.
        {DType::e5m2fnuz, -1.0f, 0xc0, -1.0f},
        // e8m0fnu: 2^(code - 127).
        {DType::e8m0fnu, 4.0f, 0x81, 4.0f},
        {DType::e8m0fnu, 0x1p-20f, 107, 0x1p-20f},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(to_string(c.d)) + " " + std::to_string(c.in));
        const Tensor t = Tensor::zeros({2, 3}, c.d);
        t.set({1, 2}, c.in);
        EXPECT_EQ(int(t.data<uint8_t>()[5]), int(c.code));
        EXPECT_EQ(int(t.at<uint8_t>({1, 2})), int(c.code));
        EXPECT_TRUE(same_float(t.get({1, 2}), c.out)) << t.get({1, 2});
        EXPECT_EQ(t.data<uint8_t>()[0], 0);  // neighbours untouched
        EXPECT_EQ(t.data<uint8_t>()[4], 0);
    }
    // NaN stays NaN in every FP8 dtype.
    for (DType d : {DType::e4m3fn, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz, DType::e8m0fnu}) {
        const Tensor t = Tensor::zeros({1}, d);
        t.set({0}, NAN);
        EXPECT_TRUE(std::isnan(t.get({0}))) << to_string(d);
    }
}

TEST(TensorElements, BadIndicesThrowNamingTheProblem) {
    const Tensor x = Tensor::zeros({3, 5}, DType::f32);
    expect_error([&] { (void)x.get({3, 0}); }, "out of range");
    expect_error([&] { (void)x.get({0, 5}); }, "out of range");
    expect_error([&] { (void)x.get({-1, 0}); }, "out of range");
    expect_error([&] { x.set({0, 7}, 1.0f); }, "out of range");
    expect_error([&] { (void)x.get({1}); }, "index of 1 values for a 2-d tensor");
    expect_error([&] { (void)x.get({1, 1, 1}); }, "index of 3 values");
    expect_error([&] { (void)x.at<float>({0, 9}); }, "out of range");
    expect_error([&] { (void)x.size(2); }, "dimension 2");
    expect_error([&] { (void)x.size(-3); }, "dimension -3");
    // Out of range in a view is judged by the view's shape, not the storage's.
    const Tensor v = x.slice(1, 1, 3);
    expect_error([&] { (void)v.get({0, 2}); }, "out of range");
}

// The appended element types: from() picks the dtype of the C++ type, get/set convert exactly and
// refuse values outside the type (bounds: the C++ limits, as float).
TEST(Tensor, WiderIntegerAndF64ElementsFromGetSet) {
    EXPECT_EQ(Tensor::from(std::vector<double>{1.5}, {1}).dtype(), DType::f64);
    EXPECT_EQ(Tensor::from(std::vector<int8_t>{-3}, {1}).get({0}), -3.0f);
    EXPECT_EQ(Tensor::from(std::vector<int16_t>{-300}, {1}).get({0}), -300.0f);
    EXPECT_EQ(Tensor::from(std::vector<int64_t>{int64_t(1) << 40}, {1}).get({0}), 0x1p40f);
    EXPECT_EQ(Tensor::from(std::vector<uint16_t>{65535}, {1}).get({0}), 65535.0f);
    EXPECT_EQ(Tensor::from(std::vector<uint32_t>{4000000000u}, {1}).get({0}), 4.0e9f);
    EXPECT_EQ(Tensor::from(std::vector<uint64_t>{uint64_t(1) << 63}, {1}).dtype(), DType::u64);
    const Tensor b = Tensor::zeros({2}, DType::boolean);
    b.set({1}, 1.0f);
    EXPECT_EQ(b.data<uint8_t>()[1], 1);
    expect_error([&] { b.set({0}, 2.0f); }, "not a bool value");
    const Tensor i8 = Tensor::zeros({1}, DType::i8);
    expect_error([&] { i8.set({0}, 128.0f); }, "not a i8 value");
    i8.set({0}, -128.0f);
    EXPECT_EQ(i8.data<int8_t>()[0], -128);
    const Tensor u64 = Tensor::zeros({1}, DType::u64);
    expect_error([&] { u64.set({0}, 0x1p64f); }, "not a u64 value");
    u64.set({0}, 0x1p63f);
    EXPECT_EQ(u64.data<uint64_t>()[0], uint64_t(1) << 63);
    const Tensor i64 = Tensor::zeros({1}, DType::i64);
    expect_error([&] { i64.set({0}, 0x1p63f); }, "not a i64 value");
    i64.set({0}, -0x1p63f);
    EXPECT_EQ(i64.data<int64_t>()[0], INT64_MIN);
    expect_error([&] { (void)Tensor::zeros({1}, DType::u16).data<int16_t>(); }, "u16");
}

// view_of shares the owner (kept alive by the tensor) and refuses misaligned data.
TEST(Tensor, ViewOfExternalMemoryKeepsItsOwnerAlive) {
    auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
    std::weak_ptr<std::vector<float>> watch = owner;
    const float* p = owner->data();
    Tensor t = Tensor::view_of(std::move(owner), p + 1, {2, 2}, DType::f32);
    EXPECT_FALSE(watch.expired());
    EXPECT_EQ(t.data<const float>(), p + 1);
    EXPECT_EQ(t.get({1, 1}), 5.0f);
    EXPECT_TRUE(t.is_contiguous());
    const auto bytes = std::make_shared<std::vector<std::byte>>(16);
    expect_error([&] { (void)Tensor::view_of(bytes, bytes->data() + 1, {2}, DType::i32); }, "not aligned");
    t = Tensor();
    EXPECT_TRUE(watch.expired());
}

// A layer's output allocated every call gets the block the last call freed (no fresh pages), and
// a block in use is never handed out again.
TEST(HostMemory, AFreedLargeBlockIsReusedForTheSameSizeAndNeverWhileAlive) {
    const size_t bytes = 5 * detail::host_cache_min;  // a multiple: no rounding
    const Shape shape{int64_t(detail::host_cache_min / 4), 5};  // f32
    const void* first = nullptr;
    {
        const Tensor t = Tensor::empty(shape, DType::f32);
        first = t.raw_data();
    }
    const size_t cached = detail::host_cached_bytes();
    EXPECT_GE(cached, bytes);
    const Tensor again = Tensor::empty(shape, DType::f32);
    EXPECT_EQ(again.raw_data(), first);
    EXPECT_EQ(detail::host_cached_bytes(), cached - bytes);
    const Tensor other = Tensor::empty(shape, DType::f32);  // same size, while `again` lives
    EXPECT_NE(other.raw_data(), again.raw_data());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(other.raw_data()) % tensor_alignment, 0u);
    // Writing one does not touch the other.
    std::memset(other.raw_data(), 0xFF, other.nbytes());
    std::memset(again.raw_data(), 0, again.nbytes());
    EXPECT_EQ(static_cast<const uint8_t*>(other.raw_data())[other.nbytes() - 1], 0xFF);
}

// A large block starts on a 2 MiB boundary, so that every page of it can be a huge page (the
// OS is asked for them; the hint itself has no visible effect to test), the small ones on
// tensor_alignment; both usable in full.
TEST(HostMemory, LargeBlocksStartOnAHugePageBoundary) {
    for (const size_t bytes : {detail::host_cache_min, 3 * detail::host_cache_min + 5, size_t(100)}) {
        const Tensor t = Tensor::empty({int64_t(bytes)}, DType::u8);
        const size_t want = bytes >= detail::host_cache_min ? detail::host_cache_min : tensor_alignment;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % want, 0u) << bytes << " bytes";
        std::memset(t.raw_data(), 7, bytes);
        EXPECT_EQ(t.data<uint8_t>()[bytes - 1], 7);
    }
}

// A lasting block (a packed weight's) starts where host_allocate's would, is usable in full, and
// goes back to the system when freed: the cache of freed blocks, which holds sizes rounded to
// 2 MiB, does not keep it. The wrong answer, host_allocate's block, is kept (while the cache has
// room for it, so that keeping it drops nothing).
TEST(HostMemory, LastingBlocksAreAlignedAndNeverCached) {
    const auto kept_after_free = [](auto allocate, size_t bytes) {
        std::shared_ptr<std::byte> p = allocate(bytes);
        const size_t want = bytes >= detail::host_cache_min ? detail::host_cache_min : tensor_alignment;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % want, 0u) << bytes << " bytes";
        std::memset(p.get(), 7, bytes);
        EXPECT_EQ(static_cast<uint8_t>(p.get()[bytes - 1]), 7);
        const size_t alive = detail::host_cached_bytes();
        p.reset();
        return detail::host_cached_bytes() - alive;
    };
    const size_t large = 3 * detail::host_cache_min + 5;
    EXPECT_EQ(kept_after_free(detail::host_allocate_lasting, large), 0u);
    EXPECT_EQ(kept_after_free(detail::host_allocate_lasting, size_t(100)), 0u);
    if (detail::host_cached_bytes() + 4 * detail::host_cache_min <= detail::host_cache_cap) {
        EXPECT_EQ(kept_after_free(detail::host_allocate, large), 4 * detail::host_cache_min);
    }
}

TEST(HostMemory, ZerosClearsAReusedBlock) {
    const Shape shape{int64_t(detail::host_cache_min) / 2 + 3};  // u16: 2 MiB + 6 bytes -> 4 MiB
    const void* dirty = nullptr;
    {
        const Tensor t = Tensor::empty(shape, DType::u16);
        std::memset(t.raw_data(), 0xAB, t.nbytes());
        dirty = t.raw_data();
    }
    const Tensor z = Tensor::zeros(shape, DType::u16);
    ASSERT_EQ(z.raw_data(), dirty);  // the reused block, or this test shows nothing
    const auto* v = z.data<const uint16_t>();
    EXPECT_EQ(std::count(v, v + z.numel(), uint16_t(0)), z.numel());
}

// Freed blocks of sizes never asked for again: the cache keeps the latest within its cap, and a
// block larger than the cap is returned at once.
TEST(HostMemory, BlocksKeptStayWithinTheCap) {
    const size_t mib = size_t(1) << 20;
    for (int i = 0; i < 12; ++i) {
        (void)Tensor::empty({int64_t((34 + 2 * i) * mib)}, DType::u8);
        EXPECT_LE(detail::host_cached_bytes(), detail::host_cache_cap) << "after block " << i;
    }
    EXPECT_GE(detail::host_cached_bytes(), detail::host_cache_cap - 56 * mib);  // it does keep blocks
    const size_t before = detail::host_cached_bytes();
    (void)Tensor::empty({int64_t(detail::host_cache_cap + mib)}, DType::u8);
    EXPECT_EQ(detail::host_cached_bytes(), before);
}

// A decode step's GEMM takes the same scratch sizes every call: the thread gets its released block
// back (no allocation), never one still held, always aligned.
TEST(HostMemory, ScratchReleasedIsReusedByItsThread) {
    const size_t bytes = 1000;  // rounded to 1024
    void* first = detail::scratch_acquire(bytes);
    detail::scratch_release(first, bytes);
    void* again = detail::scratch_acquire(1024);
    EXPECT_EQ(again, first);
    void* other = detail::scratch_acquire(bytes);
    EXPECT_NE(other, again);
    for (void* p : {again, other}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % tensor_alignment, 0u);
    std::memset(again, 1, 1024);  // both usable in full at once
    std::memset(other, 2, 1024);
    EXPECT_EQ(static_cast<const uint8_t*>(again)[1023], 1);
    detail::scratch_release(other, bytes);
    detail::scratch_release(again, bytes);
}

// After GEMMs of other shapes the thread's list is full of their sizes. The block a call releases
// then is still kept - the least recently released one makes room - and comes back to the next
// call of its size. Wrong answer it catches: a full list that freed every later block, so that a
// decode step's small GEMM allocated and freed each buffer on every call (there the freed block
// goes to `taken`, allocated in between as the kernel's next buffer would be).
TEST(HostMemory, ScratchFullKeepsTheMostRecentBlocks) {
    std::vector<void*> stale;
    const auto stale_bytes = [](size_t i) { return 4096 + 64 * i; };  // distinct sizes, none 2048
    for (size_t i = 0; i < detail::scratch_kept; ++i) stale.push_back(detail::scratch_acquire(stale_bytes(i)));
    for (size_t i = 0; i < stale.size(); ++i) detail::scratch_release(stale[i], stale_bytes(i));
    void* block = detail::scratch_acquire(2048);
    detail::scratch_release(block, 2048);
    void* taken = ::operator new(2048, std::align_val_t{tensor_alignment});
    void* again = detail::scratch_acquire(2048);
    EXPECT_EQ(again, block);
    EXPECT_NE(taken, block);
    // The oldest stale block made room; the newest is still there for its size.
    void* newest = detail::scratch_acquire(stale_bytes(detail::scratch_kept - 1));
    EXPECT_EQ(newest, stale.back());
    ::operator delete(taken, std::align_val_t{tensor_alignment});
    detail::scratch_release(again, 2048);
    detail::scratch_release(newest, stale_bytes(detail::scratch_kept - 1));
}

// A large scratch block (packed A of a big GEMM) is one of the cache's huge-page blocks: it starts
// on a 2 MiB boundary and, released, is handed back to the next call of its size (from any
// thread), never while held.
TEST(HostMemory, LargeScratchComesFromTheBlockCache) {
    const size_t bytes = 2 * detail::host_cache_min + 100;  // rounded to 3 x 2 MiB
    void* first = detail::scratch_acquire(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % detail::host_cache_min, 0u);
    std::memset(first, 3, bytes);
    void* other = detail::scratch_acquire(bytes);
    EXPECT_NE(other, first);
    const size_t cached = detail::host_cached_bytes();
    detail::scratch_release(first, bytes);
    EXPECT_EQ(detail::host_cached_bytes(), cached + 3 * detail::host_cache_min);
    void* again = detail::scratch_acquire(3 * detail::host_cache_min);  // the same rounded size
    EXPECT_EQ(again, first);
    EXPECT_EQ(detail::host_cached_bytes(), cached);
    detail::scratch_release(again, 3 * detail::host_cache_min);
    detail::scratch_release(other, bytes);
}

}  // namespace
}  // namespace fp8kit::test
