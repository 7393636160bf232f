// tests/ops/test_quantize.cpp: every fast backend against ref for the cast operations - amax,
// per-group amax, quantize, cast_transpose, dequantize - bit for bit (codes, scales, amax), on
// every CPU code path and on the cuda backend (Cuda* tests: skipped, saying why, without a GPU), granularity, data format, input dtype and overflow mode, on shapes that
// include 1x1, 1xN, Nx1, primes, sizes that cut blocks at the edges, strided views, and sizes
// large enough to run on several threads (where the result must not depend on the thread count).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.hpp"
#include "support.hpp"

namespace fp8kit {
namespace {

using test::bits;
using test::same_code;
using test::on_backend;
using test::same_float;

struct Case {
    std::string name;
    QuantizeOptions opts;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> granularities() {
    std::vector<Case> cases;
    const auto add = [&](std::string name, Scaling s, auto&& tweak) {
        QuantizeOptions o;
        o.scaling = s;
        tweak(o);
        cases.push_back({std::move(name), o});
    };
    const auto none = [](QuantizeOptions&) {};
    add("tensor", Scaling::tensor(), none);
    add("tensor_given_scale", Scaling::tensor(), [](QuantizeOptions& o) { o.scale = Tensor::full({1}, 3.25f); });
    add("tensor_pow2_eps", Scaling::tensor(), [](QuantizeOptions& o) { o.power_of_two = true; o.amax_epsilon = 1e-3f; });
    add("row_pow2", Scaling::row(), [](QuantizeOptions& o) { o.power_of_two = true; });
    add("column", Scaling::column(), none);
    add("block_1x128", Scaling::block(1, 128), none);
    add("block_128x128", Scaling::block(128, 128), none);
    add("block_3x5", Scaling::block(3, 5), none);
    add("block_1x16", Scaling::block(1, 16), none);
    add("block_40x1", Scaling::block(40, 1), none);
    add("mx32", Scaling::mx32(), none);
    add("mx32_up", Scaling::mx32(), [](QuantizeOptions& o) { o.mx_rounding = MxRounding::up; });
    return cases;
}

// {1, 256}, {1, 64}: one row of a power-of-two width up to 256, a decode step's cast (on the cuda
// backend once cast with scale 1: tensor and row scaling took the 1 x n in-warp path).
const std::vector<std::pair<int64_t, int64_t>> shapes = {
    {1, 1}, {1, 1000}, {1000, 1}, {1, 256}, {1, 64}, {17, 33}, {127, 257}, {130, 300}, {256, 256}, {300, 520}};

// N(0,1) values whose magnitude varies by row and column (so row, column and block scales
// differ), with zeros, -0, tiny values and a few large ones; with `specials`, also NaN and +-Inf.
Tensor make_input(int64_t rows, int64_t cols, DType dtype, bool specials, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> v(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
            const float mag = std::ldexp(1.0f, int((i * 7 + j / 16) % 13) - 6);
            v[size_t(i * cols + j)] = normal(rng) * mag;
        }
    }
    std::uniform_int_distribution<size_t> pick(0, v.size() - 1);
    for (int k = 0; k < 4; ++k) {
        v[pick(rng)] = 0.0f;
        v[pick(rng)] = -0.0f;
        v[pick(rng)] = 1e-30f;
        v[pick(rng)] = -3e4f;
    }
    if (specials) {
        v[pick(rng)] = NAN;
        v[pick(rng)] = INFINITY;
        v[pick(rng)] = -INFINITY;
    }
    Tensor f = Tensor::from(v, {rows, cols});
    if (dtype == DType::f32) return f;
    Tensor t = Tensor::empty({rows, cols}, dtype);
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) t.set({i, j}, f.get({i, j}));
    }
    return t;
}

::testing::AssertionResult same_codes(const Tensor& a, const Tensor& b, Format f) {
    if (a.shape() != b.shape()) return ::testing::AssertionFailure() << "shape " << to_string(a.shape()) << " vs " << to_string(b.shape());
    const uint8_t* pa = a.data<uint8_t>();
    const uint8_t* pb = b.data<uint8_t>();
    for (int64_t k = 0; k < a.numel(); ++k) {
        if (!same_code(pa[k], pb[k], f)) {
            return ::testing::AssertionFailure() << "code " << k << " (row " << k / a.size(-1) << ", col " << k % a.size(-1)
                                                 << "): " << test::hex(pa[k], 2) << " vs ref " << test::hex(pb[k], 2);
        }
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_scales(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
        return ::testing::AssertionFailure() << "scale_inv " << to_string(a.shape()) << " vs " << to_string(b.shape());
    }
    for (int64_t k = 0; k < a.numel(); ++k) {
        const bool same = a.dtype() == DType::f32 ? same_float(a.data<float>()[k], b.data<float>()[k])
                                                  : a.data<uint8_t>()[k] == b.data<uint8_t>()[k];
        if (!same) return ::testing::AssertionFailure() << "scale_inv " << k << ": " << a.get({k / a.size(1), k % a.size(1)})
                                                        << " vs ref " << b.get({k / b.size(1), k % b.size(1)});
    }
    return ::testing::AssertionSuccess();
}

void expect_same(const QTensor& got, const QTensor& ref) {
    EXPECT_TRUE(same_codes(got.data, ref.data, ref.format()));
    EXPECT_TRUE(same_scales(got.scale_inv, ref.scale_inv));
    ASSERT_TRUE(got.amax.defined() && ref.amax.defined());
    EXPECT_TRUE(same_float(got.amax.get({0}), ref.amax.get({0}))) << got.amax.get({0}) << " vs ref " << ref.amax.get({0});
    EXPECT_EQ(bits(got.amax.get({0})) == bits(ref.amax.get({0})), true) << "amax bits (NaN is canonical)";
    ASSERT_EQ(got.has_transpose(), ref.has_transpose());
    if (ref.has_transpose()) {
        EXPECT_TRUE(same_codes(got.data_t, ref.data_t, ref.format())) << "transposed copy";
        EXPECT_TRUE(same_scales(got.scale_inv_t, ref.scale_inv_t)) << "transposed copy";
    }
}

constexpr Format data_formats[] = {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz};
constexpr DType input_dtypes[] = {DType::f32, DType::bf16, DType::f16};

// The whole grid for one granularity (one ctest test each, so they run in parallel): calls
// check(x, opts, ref, dequantize_too) for every shape x dtype x NaN/Inf x format x overflow x
// quantize / cast_transpose, with ref's result (dequantize checked on the finite quantizes).
class QuantizeGrid : public ::testing::TestWithParam<Case> {};

template <class Check>
void run_grid(const Case& c, Check&& check) {
    uint32_t seed = 1;
    for (const auto& shape : shapes) {
        const int64_t rows = shape.first, cols = shape.second;  // (clang 14: lambdas cannot capture bindings)
        for (DType dtype : input_dtypes) {
            for (bool specials : {false, true}) {
                const Tensor x = make_input(rows, cols, dtype, specials, seed++);
                for (Format f : data_formats) {
                    for (Overflow o : {Overflow::saturate, Overflow::nonsaturating}) {
                        for (bool transpose : {false, true}) {
                            QuantizeOptions opts = c.opts;
                            opts.format = f;
                            opts.overflow = o;
                            opts.transpose = transpose;
                            SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " " + std::string(to_string(dtype)) +
                                         " " + std::string(to_string(f)) + " " + std::string(to_string(o)) +
                                         (specials ? " nan/inf" : "") + (transpose ? " cast_transpose" : " quantize"));
                            check(x, opts, on_backend(Backend::ref, [&] { return quantize(x, opts); }), !transpose && !specials);
                        }
                    }
                }
            }
        }
    }
}

// Every element of a dequantized tensor equals ref's, bit for bit (NaN for NaN). Equal bytes
// settle it at once; else the elements are compared one by one, naming the first that differs.
// (Element by element always, this was a quarter of the grid's time, more under ASan and qemu.)
void expect_same_values(const Tensor& got, const Tensor& want, DType out) {
    ASSERT_EQ(got.shape(), want.shape());
    ASSERT_EQ(got.dtype(), out);
    if (got.is_contiguous() && want.is_contiguous() && want.dtype() == out &&
        std::memcmp(got.const_raw_data(), want.const_raw_data(), want.nbytes()) == 0) {
        return;
    }
    const int64_t cols = want.size(-1);
    for (int64_t k = 0; k < want.numel(); ++k) {
        const int64_t i = k / cols, j = k % cols;
        ASSERT_TRUE(same_float(got.get({i, j}), want.get({i, j}))) << "dequantize to " << to_string(out) << " at " << i << "," << j;
    }
}

TEST_P(QuantizeGrid, CpuEqualsRefBitForBit) {
    run_grid(GetParam(), [](const Tensor& x, const QuantizeOptions& opts, const QTensor& ref, bool dequantize_too) {
        test::for_each_isa([&](Isa) { expect_same(on_backend(Backend::cpu, [&] { return quantize(x, opts); }), ref); });
        if (!dequantize_too) return;
        for (DType out : input_dtypes) {
            const Tensor want = on_backend(Backend::ref, [&] { return dequantize(ref, out); });
            test::for_each_isa([&](Isa) { expect_same_values(on_backend(Backend::cpu, [&] { return dequantize(ref, out); }), want, out); });
        }
    });
}

// The cuda backend (a GPU present): the same grid, inputs and given scales on the device, every
// result copied back and compared with ref bit for bit.
QuantizeOptions on_device(QuantizeOptions o) {
    if (o.scale.defined()) o.scale = o.scale.to(Device::cuda);
    return o;
}

TEST_P(QuantizeGrid, CudaEqualsRefBitForBit) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    run_grid(GetParam(), [](const Tensor& x, const QuantizeOptions& opts, const QTensor& ref, bool dequantize_too) {
        const QTensor got = quantize(x.to(Device::cuda), on_device(opts));
        ASSERT_EQ(got.data.device(), Device::cuda);
        expect_same(got.to(Device::cpu), ref);
        if (!dequantize_too) return;
        const QTensor ref_d = ref.to(Device::cuda);
        for (DType out : input_dtypes) {
            expect_same_values(dequantize(ref_d, out).to(Device::cpu), on_backend(Backend::ref, [&] { return dequantize(ref, out); }), out);
        }
    });
}

INSTANTIATE_TEST_SUITE_P(Granularity, QuantizeGrid, ::testing::ValuesIn(granularities()),
                         [](const auto& param_info) { return param_info.param.name; });

TEST(QuantizeOps, AmaxEqualsRef) {
    for (const auto& shape : shapes) {
        const int64_t rows = shape.first, cols = shape.second;  // (clang 14: lambdas cannot capture bindings)
        for (DType dtype : input_dtypes) {
            for (bool specials : {false, true}) {
                const Tensor x = make_input(rows, cols, dtype, specials, 99);
                const float want = on_backend(Backend::ref, [&] { return amax(x); });
                for (const Case& c : granularities()) {
                    const Tensor want_groups = on_backend(Backend::ref, [&] { return amax(x, c.opts.scaling); });
                    test::for_each_isa([&](Isa) {
                        EXPECT_EQ(bits(on_backend(Backend::cpu, [&] { return amax(x); })), bits(want));
                        const Tensor got = on_backend(Backend::cpu, [&] { return amax(x, c.opts.scaling); });
                        EXPECT_TRUE(same_scales(got, want_groups)) << c.name;
                    });
                }
            }
        }
    }
}

TEST(QuantizeOps, CudaAmaxEqualsRef) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    for (const auto& shape : shapes) {
        const int64_t rows = shape.first, cols = shape.second;
        for (DType dtype : input_dtypes) {
            for (bool specials : {false, true}) {
                const Tensor x = make_input(rows, cols, dtype, specials, 99);
                const Tensor xd = x.to(Device::cuda);
                EXPECT_EQ(bits(amax(xd)), bits(on_backend(Backend::ref, [&] { return amax(x); })));
                for (const Case& c : granularities()) {
                    const Tensor want = on_backend(Backend::ref, [&] { return amax(x, c.opts.scaling); });
                    EXPECT_TRUE(same_scales(amax(xd, c.opts.scaling).to(Device::cpu), want)) << c.name;
                }
            }
        }
    }
    // A large input: amax and tensor scaling through the many-blocks-per-group path.
    const Tensor big = make_input(2049, 3001, DType::bf16, true, 5);
    EXPECT_EQ(bits(amax(big.to(Device::cuda))), bits(on_backend(Backend::ref, [&] { return amax(big); })));
    // Rows of a multiple of 8 (the row-major kernels), 1032 long; with 32 x 32 blocks, more groups
    // than blocks, so the blocks of the one-group-a-block kernel take several groups each.
    const Tensor tall = make_input(2000, 1032, DType::bf16, true, 7);
    std::vector<Case> tall_cases = granularities();
    QuantizeOptions block32;
    block32.scaling = Scaling::block(32, 32);
    tall_cases.push_back({"block_32x32", block32});
    for (const Case& c : tall_cases) {
        SCOPED_TRACE(c.name + " 2000x1032");
        expect_same(quantize(tall.to(Device::cuda), on_device(c.opts)).to(Device::cpu),
                    on_backend(Backend::ref, [&] { return quantize(tall, c.opts); }));
    }
    const Tensor bigf = make_input(2049, 3001, DType::f32, false, 6);
    for (const Case& c : granularities()) {
        QuantizeOptions opts = c.opts;
        opts.transpose = true;
        SCOPED_TRACE(c.name + " 2049x3001");
        expect_same(quantize(bigf.to(Device::cuda), on_device(opts)).to(Device::cpu),
                    on_backend(Backend::ref, [&] { return quantize(bigf, opts); }));
    }
}

// Each recipe's cast once, with and without the transposed copy, on inputs small enough for
// compute-sanitizer (scripts/cuda_device_check.sh runs this under memcheck and racecheck): every
// cuda cast kernel of src/cuda/quantize.cu (136 x 2112: row scaling one group a block; 300 x 520:
// partial tiles, row scaling through the amax pass), against ref.
TEST(QuantizeOps, CudaRecipesOnce) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const std::pair<int64_t, int64_t> sanitized[] = {{300, 520}, {136, 2112}};
    uint32_t seed = 30;
    for (const auto& shape : sanitized) {
        const Tensor x = make_input(shape.first, shape.second, DType::bf16, seed % 2 == 1, seed);
        ++seed;
        const Tensor xd = x.to(Device::cuda);
        for (const Scaling& s : {Scaling::tensor(), Scaling::row(), Scaling::block(1, 128), Scaling::block(128, 128), Scaling::mx32()}) {
            for (bool transpose : {false, true}) {
                QuantizeOptions opts;
                opts.scaling = s;
                opts.transpose = transpose;
                SCOPED_TRACE(std::to_string(shape.first) + "x" + std::to_string(shape.second) + " " + to_string(s) +
                             (transpose ? " cast_transpose" : ""));
                expect_same(quantize(xd, opts).to(Device::cpu), on_backend(Backend::ref, [&] { return quantize(x, opts); }));
            }
        }
    }
}

// The shapes the casts are timed on (DeepGEMM's [tokens, hidden] activations) and ones that cut
// the cuda kernels' tiles and per-thread chunk counts at odd places (src/cuda/quantize.cu: 129 x
// 1544: partial 128 x 128 tiles, transposed rows not a multiple of 16 bytes, one chunk a thread;
// 64 x 2112: two; 7168: four), bf16 with and without NaN/Inf, every recipe's scaling with and
// without the transposed copy, e4m3fn saturating (the hardware conversion) and e5m2fnuz (the
// generic encode). Against the host backend (bit for bit ref's on the grid above) rather than ref
// itself, which takes seconds a cast at these sizes.
TEST(QuantizeOps, CudaLargeShapesEqualHost) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const std::pair<int64_t, int64_t> timed[] = {{4096, 7168}, {64, 7168}, {64, 2112}, {129, 1544}};
    uint32_t seed = 40;
    for (const auto& shape : timed) {
        for (bool specials : {false, true}) {
            const Tensor x = make_input(shape.first, shape.second, DType::bf16, specials, seed++);
            const Tensor xd = x.to(Device::cuda);
            EXPECT_EQ(bits(amax(xd)), bits(amax(x)));
            for (const Scaling& s : {Scaling::tensor(), Scaling::row(), Scaling::block(1, 128), Scaling::block(128, 128), Scaling::mx32()}) {
                for (Format f : {Format::e4m3fn, Format::e5m2fnuz}) {
                    for (bool transpose : {false, true}) {
                        if (f == Format::e5m2fnuz && shape.first == 4096) continue;  // the generic encode: slow, and covered on the others
                        QuantizeOptions opts;
                        opts.scaling = s;
                        opts.format = f;
                        opts.transpose = transpose;
                        SCOPED_TRACE(std::to_string(shape.first) + "x" + std::to_string(shape.second) + " " + to_string(s) + " " +
                                     std::string(to_string(f)) + (specials ? " nan/inf" : "") + (transpose ? " cast_transpose" : ""));
                        expect_same(quantize(xd, opts).to(Device::cpu), quantize(x, opts));
                    }
                }
            }
        }
    }
}

// NonFinite::error on the device: refused before anything is written, naming the index.
TEST(QuantizeOps, CudaNonFiniteErrorNamesTheIndex) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    Tensor x = make_input(40, 70, DType::f32, false, 3);
    x.set({17, 33}, NAN);
    QuantizeOptions o;
    o.non_finite = NonFinite::error;
    test::expect_error([&] { (void)quantize(x.to(Device::cuda), o); }, "NaN at index [17, 33]");
}

// Views: a column slice and a row slice of a larger matrix are read in place (row stride > cols).
TEST(QuantizeOps, StridedViewsEqualRef) {
    const Tensor big = make_input(300, 520, DType::f32, false, 7);
    const bool on_cuda = test::cuda_part_runs("the same views on the device");
    for (const Tensor& x : {big.slice(1, 3, 260), big.slice(0, 1, 299).slice(1, 129, 520)}) {
        for (const Case& c : granularities()) {
            QuantizeOptions opts = c.opts;
            opts.transpose = true;
            const QTensor ref = on_backend(Backend::ref, [&] { return quantize(x, opts); });
            const QTensor contiguous = on_backend(Backend::cpu, [&] { return quantize(x.contiguous(), opts); });
            test::for_each_isa([&](Isa) { expect_same(on_backend(Backend::cpu, [&] { return quantize(x, opts); }), ref); });
            expect_same(contiguous, ref);
            if (on_cuda) {  // the same views of a device copy of big, read in place
                const Tensor bd = big.to(Device::cuda);
                const Tensor xd = x.shape()[0] == 300 ? bd.slice(1, 3, 260) : bd.slice(0, 1, 299).slice(1, 129, 520);
                expect_same(quantize(xd, on_device(opts)).to(Device::cpu), ref);
            }
        }
    }
}

// MX scales at every exponent and at the edges of the rule (scaling.hpp's mx_scale_code; the SIMD
// kernels compute it on the amax bits, vector-wide): each 1x32 group of a 64 x 512 f32 matrix has
// one element of magnitude A and 31 of A / 2, A running over 0, the smallest subnormal, 2^-127,
// 1.5 x 2^-126, s x 2^e for e in [-126, 127] with s = 1, the format's max / 2^emax (the largest
// significand that rounding up keeps in place) and the next float above it, FLT_MAX, Inf and NaN.
// With the transposed copy, its 32x1 groups take the columns' maxima. Every data format, both
// roundings, on every ISA path, against ref bit for bit: an exponent off by one, a limit compared
// with >= instead of >, or a zero group given anything but code 0 changes a scale.
TEST(QuantizeOps, Mx32ScalesAtEveryExponentEqualRef) {
    for (Format f : data_formats) {
        const int emax = mx_emax(f);
        const float limit = format_info(f).max / std::ldexp(1.0f, emax);
        std::vector<float> amaxes = {0.0f, std::ldexp(1.0f, -149), std::ldexp(1.0f, -127), 1.5f * std::ldexp(1.0f, -126),
                                     std::numeric_limits<float>::max(), INFINITY, NAN};
        for (int e = -126; e <= 127; ++e) {
            for (float s : {1.0f, limit, std::nextafter(limit, 2.0f)}) amaxes.push_back(std::ldexp(s, e));
        }
        const int64_t rows = 64, cols = 512;
        ASSERT_LE(amaxes.size(), size_t(rows * cols / 32));
        Tensor x = Tensor::empty({rows, cols}, DType::f32);
        for (int64_t i = 0; i < rows; ++i) {
            for (int64_t g = 0; g < cols / 32; ++g) {
                const float a = amaxes[size_t(i * cols / 32 + g) % amaxes.size()];
                for (int64_t e = 0; e < 32; ++e) x.data<float>()[i * cols + g * 32 + e] = e == i % 32 ? a : a / 2;
            }
        }
        for (MxRounding r : {MxRounding::floor, MxRounding::up}) {
            for (bool transpose : {false, true}) {
                QuantizeOptions opts;
                opts.scaling = Scaling::mx32();
                opts.format = f;
                opts.mx_rounding = r;
                opts.transpose = transpose;
                SCOPED_TRACE(std::string(to_string(f)) + (r == MxRounding::up ? " up" : " floor") + (transpose ? " cast_transpose" : ""));
                const QTensor ref = on_backend(Backend::ref, [&] { return quantize(x, opts); });
                test::for_each_isa([&](Isa) { expect_same(on_backend(Backend::cpu, [&] { return quantize(x, opts); }), ref); });
            }
        }
    }
}

// The thread count never changes a result: every granularity on 1 thread and on 2.
TEST(QuantizeOps, ThreadCountDoesNotChangeResults) {
    const Tensor x = make_input(1024, 384, DType::bf16, true, 11);
    const int saved = num_threads();
    for (const Case& c : granularities()) {
        QuantizeOptions opts = c.opts;
        opts.transpose = true;
        const QTensor ref = on_backend(Backend::ref, [&] { return quantize(x, opts); });
        for (int threads : {1, 2, 3}) {
            set_num_threads(threads);
            expect_same(on_backend(Backend::cpu, [&] { return quantize(x, opts); }), ref);
        }
    }
    set_num_threads(saved);
}

}  // namespace
}  // namespace fp8kit
