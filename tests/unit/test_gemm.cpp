// tests/unit/test_gemm.cpp: the contract of <fp8kit/gemm.hpp> that does not need large data -
//  - bad arguments throw fp8kit::Error whose message names what was wrong (the argument, the
//    value, what was expected), on every backend;
//  - gemm_k_group, against the rule of NUMERICS.md ("Scales and K groups") worked out by hand;
//  - small GEMMs on QTensors built by hand (codes of exactly representable values, scale_inv
//    values chosen here, not made by quantize) whose exact D is written out here: every
//    intermediate is exact in float32, so every backend must give it exactly.
// The numerics on large grids are tests/ops/test_gemm.cpp's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/backend.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/gemm.hpp"
#include "fp8kit/quantize.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

Tensor normal_matrix(int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> v(size_t(rows * cols));
    for (float& x : v) x = nd(rng);
    return Tensor::from(v, {rows, cols});
}

QuantizeOptions qopts(Scaling s, Format f = Format::e4m3fn) {
    QuantizeOptions o;
    o.scaling = s;
    o.format = f;
    return o;
}

QTensor q(int64_t rows, int64_t cols, Scaling s = Scaling::row(), Format f = Format::e4m3fn, uint32_t seed = 1) {
    return quantize(normal_matrix(rows, cols, seed), qopts(s, f));
}

// A QTensor built by hand: `values` must be exactly representable in f (checked), scale_inv
// is f32 [scale_rows, scale_cols], or e8m0 codes for mx32 (`e8m0`).
QTensor hand(const std::vector<float>& values, int64_t rows, int64_t cols, Format f, Scaling s,
             const std::vector<float>& scale_inv, Shape scale_shape, const std::vector<uint8_t>& e8m0 = {}) {
    QTensor t;
    t.scaling = s;
    t.data = Tensor::empty({rows, cols}, dtype_of(f));
    uint8_t* codes = t.data.data<uint8_t>();
    for (size_t i = 0; i < values.size(); ++i) {
        codes[i] = encode(values[i], f);
        EXPECT_EQ(decode(codes[i], f), values[i]) << "hand value " << values[i] << " is not exact in " << to_string(f);
    }
    if (e8m0.empty()) {
        t.scale_inv = Tensor::from(scale_inv, std::move(scale_shape));
    } else {
        t.scale_inv = Tensor::empty(std::move(scale_shape), DType::e8m0fnu);
        std::memcpy(t.scale_inv.data<uint8_t>(), e8m0.data(), e8m0.size());
    }
    return t;
}

void expect_values(const Tensor& d, const std::vector<std::vector<float>>& want) {
    ASSERT_EQ(d.dim(), 2);
    ASSERT_EQ(d.size(0), int64_t(want.size()));
    for (int64_t i = 0; i < d.size(0); ++i) {
        ASSERT_EQ(d.size(1), int64_t(want[size_t(i)].size()));
        for (int64_t j = 0; j < d.size(1); ++j) {
            EXPECT_EQ(d.get({i, j}), want[size_t(i)][size_t(j)]) << "D[" << i << ", " << j << "]";
        }
    }
}

// ---- hand-computed GEMMs ----

// Tensor scales, e4m3fn x e5m2, with alpha, beta * C and bias:
//   deq(A) = 0.5 * [[1, 2, -0.5], [3, 0.25, 4]],  deq(B) = 4 * [[2, 1, 1], [-1, 0.5, 8], [0, 0, 0]]
//   A.B^T = 2 * [[3.5, -4, 0], [10.25, 29.125, 0]]
//   D = 0.5 * A.B^T + 1 * C + bias, C = [[1, 1, 1], [2, 2, 2]], bias = [0.5, -1, 0.25]
TEST(GemmHand, TensorScalesAndTheEpilogue) {
    const QTensor a = hand({1, 2, -0.5f, 3, 0.25f, 4}, 2, 3, Format::e4m3fn, Scaling::tensor(), {0.5f}, {1, 1});
    const QTensor b = hand({2, 1, 1, -1, 0.5f, 8, 0, 0, 0}, 3, 3, Format::e5m2, Scaling::tensor(), {4.0f}, {1, 1});
    GemmOptions o;
    o.alpha = 0.5f;
    o.beta = 1.0f;
    o.c = Tensor::from(std::vector<float>{1, 1, 1, 2, 2, 2}, {2, 3});
    o.bias = Tensor::from(std::vector<float>{0.5f, -1, 0.25f}, {3});
    for_each_backend([&] {
        expect_values(gemm(a, b), {{7, -8, 0}, {20.5f, 58.25f, 0}});
        expect_values(gemm(a, b, o), {{5, -4, 1.25f}, {12.75f, 30.125f, 2.25f}});
        o.out_dtype = DType::bf16;
        const Tensor d16 = gemm(a, b, o);
        EXPECT_EQ(d16.dtype(), DType::bf16);
        expect_values(d16, {{5, -4, 1.25f}, {12.75f, 30.125f, 2.25f}});
        o.out_dtype = DType::f32;
    });
}

// The same GEMM written into a caller's tensor, accumulating: without C, beta scales out itself.
// Twice in a row: out = C + (0.5 AB + bias), then that + (0.5 AB + bias) - a dW summed over two
// micro-batches. Every value is exact in float32, so the expected values are exact too.
TEST(GemmHand, IntoOutAccumulates) {
    const QTensor a = hand({1, 2, -0.5f, 3, 0.25f, 4}, 2, 3, Format::e4m3fn, Scaling::tensor(), {0.5f}, {1, 1});
    const QTensor b = hand({2, 1, 1, -1, 0.5f, 8, 0, 0, 0}, 3, 3, Format::e5m2, Scaling::tensor(), {4.0f}, {1, 1});
    GemmOptions o;
    o.alpha = 0.5f;
    o.beta = 1.0f;
    o.bias = Tensor::from(std::vector<float>{0.5f, -1, 0.25f}, {3});
    for_each_backend([&] {
        const Tensor out = Tensor::from(std::vector<float>{1, 1, 1, 2, 2, 2}, {2, 3});
        gemm(a, b, o, out);
        expect_values(out, {{5, -4, 1.25f}, {12.75f, 30.125f, 2.25f}});
        gemm(a, b, o, out);
        expect_values(out, {{9, -9, 1.5f}, {23.5f, 58.25f, 2.5f}});
        // beta = 0 overwrites whatever out held (no NaN from 0 * garbage: out is not read).
        const Tensor garbage = Tensor::full({2, 3}, NAN);
        gemm(a, b, {}, garbage);
        expect_values(garbage, {{7, -8, 0}, {20.5f, 58.25f, 0}});
        // bf16 out: accumulated in float32, rounded once.
        GemmOptions o16 = o;
        o16.out_dtype = DType::bf16;
        const Tensor out16 = Tensor::zeros({2, 3}, DType::bf16);
        gemm(a, b, o16, out16);
        expect_values(out16, {{4, -5, 0.25f}, {10.75f, 28.125f, 0.25f}});
        // Refused: a shape, dtype or out that overlaps an operand.
        expect_error([&] { gemm(a, b, o, Tensor::zeros({3, 2}, DType::f32)); }, "out has shape [3, 2]");
        expect_error([&] { gemm(a, b, o, Tensor::zeros({2, 3}, DType::f16)); }, "out_dtype is f32");
        expect_error([&] { gemm(a, b, o, Tensor::zeros({3, 2}, DType::f32).transpose()); }, "contiguous");
    });
}

// An Inf in a high-precision A: with the default policy D's row that uses it is NaN (the e4m3fn
// code of Inf is NaN), exactly as the GEMM of the explicitly quantized A; the other rows are
// untouched. The nearest wrong answer - Inf clamped to 448 inside the fused cast - gives a finite
// row and fails. With NonFinite::error the GEMM throws naming the index, and leaves out alone.
TEST(GemmNonFinite, InfInAFusedPropagatesOrRaises) {
    Tensor x = normal_matrix(3, 256, 11);
    x.set({1, 200}, INFINITY);
    const QTensor w = q(5, 256, Scaling::block(128, 128));
    for (Scaling s : {Scaling::tensor(), Scaling::row(), Scaling::block(1, 128), Scaling::mx32()}) {
        SCOPED_TRACE(to_string(s));
        const QuantizeOptions o = qopts(s);
        for_each_backend([&] {
            const Tensor fused = gemm({x, o}, w);
            const Tensor unfused = gemm(quantize(x, o), w);
            for (int64_t j = 0; j < 5; ++j) {
                EXPECT_TRUE(std::isnan(fused.get({1, j}))) << "D[1, " << j << "] = " << fused.get({1, j});
                EXPECT_TRUE(std::isnan(unfused.get({1, j})));
                for (int64_t i : {0, 2}) {
                    // Tensor scaling: the Inf makes the one scale 1, so the finite rows change
                    // too - but stay finite and agree between the two paths.
                    EXPECT_TRUE(std::isfinite(fused.get({i, j})));
                    EXPECT_EQ(bits(fused.get({i, j})), bits(unfused.get({i, j})));
                }
            }
            QuantizeOptions strict = o;
            strict.non_finite = NonFinite::error;
            const Tensor out = Tensor::full({3, 5}, 2.0f);
            expect_error([&] { gemm({x, strict}, w, {}, out); }, "+Inf at index [1, 200]");
            EXPECT_EQ(out.get({2, 4}), 2.0f) << "the failed GEMM wrote into out";
        });
    }
}

// Row scales: scale_inv A = [0.25, 3], B = [2, 0.5]; the row's scale and not its neighbour's.
TEST(GemmHand, RowScalesApplyToTheirOwnRow) {
    const QTensor a = hand({1, 1, 2, -1}, 2, 2, Format::e4m3fn, Scaling::row(), {0.25f, 3.0f}, {2, 1});
    const QTensor b = hand({1, 2, 4, 0}, 2, 2, Format::e4m3fn, Scaling::row(), {2.0f, 0.5f}, {2, 1});
    // raw dots: [[3, 4], [0, 8]]; times sa_i * sb_j: [[0.5, 0.125], [6, 1.5]]
    for_each_backend([&] { expect_values(gemm(a, b), {{1.5f, 0.5f}, {0, 12}}); });
}

// mx32 along K = 64: each 32-wide group has its own e8m0 scale on each side, and D sums the
// groups' partial sums times their own sa * sb. A row 0 = 1.0 everywhere with scales 2^-1, 2^2;
// B row 0 = 1.0 with scales 2^0, 2^-3; B row 1 = 2.0 then -1.0 with scales 2^0, 2^0:
//   D[0, 0] = 32 * 1 * 2^-1 * 2^0 + 32 * 1 * 2^2 * 2^-3 = 16 + 16 = 32
//   D[0, 1] = 32 * 2 * 2^-1 + 32 * (-1) * 2^2 = 32 - 128 = -96
// (swapping the groups' scales gives 32 * 2^-4 + 32 * 2 = 66 and -4 - 64 = -68).
TEST(GemmHand, Mx32GroupsUseTheirOwnScales) {
    std::vector<float> av(64, 1.0f), bv(128, 1.0f);
    for (int k = 0; k < 64; ++k) bv[size_t(64 + k)] = k < 32 ? 2.0f : -1.0f;
    const QTensor a = hand(av, 1, 64, Format::e4m3fn, Scaling::mx32(), {}, {1, 2}, {126, 129});
    const QTensor b = hand(bv, 2, 64, Format::e4m3fn, Scaling::mx32(), {}, {2, 2}, {127, 124, 127, 127});
    for_each_backend([&] { expect_values(gemm(a, b), {{32, -96}}); });
}

// block 1x128 A x block 128x128 B, K = 256 (two groups), N = 130 (two B block rows):
// A = 1.0 with scales [0.5, 2]; B = 1.0 with scales [[1, 0.25], [4, 8]] by (row block, K block).
//   D[0, j < 128] = 128 * (0.5 * 1 + 2 * 0.25) = 128
//   D[0, j >= 128] = 128 * (0.5 * 4 + 2 * 8) = 2304
TEST(GemmHand, BlockScalesFollowRowAndKBlocks) {
    const QTensor a = hand(std::vector<float>(256, 1.0f), 1, 256, Format::e4m3fn, Scaling::block(1, 128), {0.5f, 2.0f}, {1, 2});
    const QTensor b = hand(std::vector<float>(130 * 256, 1.0f), 130, 256, Format::e4m3fn, Scaling::block(128, 128),
                           {1.0f, 0.25f, 4.0f, 8.0f}, {2, 2});
    std::vector<float> want(130, 128.0f);
    want[128] = want[129] = 2304.0f;
    for_each_backend([&] { expect_values(gemm(a, b), {want}); });
}

// GELU (tanh form) of exact pre-activations, against float64 here: within 4 float32 ulps; and
// gelu(0) = 0, large positive x stays x, large negative goes to -0 or tiny.
TEST(GemmHand, GeluIsTheTanhForm) {
    const std::vector<float> pre = {1.0f, -1.0f, 0.5f, 3.0f, 0.0f, -3.0f, 8.0f, -8.0f};
    const int64_t n = int64_t(pre.size());
    const QTensor a = hand({1.0f}, 1, 1, Format::e4m3fn, Scaling::tensor(), {1.0f}, {1, 1});
    const QTensor b = hand(pre, n, 1, Format::e4m3fn, Scaling::tensor(), {1.0f}, {1, 1});
    GemmOptions o;
    o.activation = Activation::gelu;
    for_each_backend([&] {
        const Tensor d = gemm(a, b, o);
        for (int64_t j = 0; j < n; ++j) {
            const double x = pre[size_t(j)];
            const double want = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
            EXPECT_NEAR(d.get({0, j}), want, 4 * 0x1p-24 * std::fabs(x) + 1e-30) << "gelu(" << x << ")";
        }
    });
}

// beta * C with C a bf16 view whose rows are further apart than N.
TEST(GemmHand, CIsReadThroughItsStrides) {
    const QTensor a = hand({1, 0, 0, 1}, 2, 2, Format::e4m3fn, Scaling::tensor(), {1.0f}, {1, 1});  // identity
    const QTensor b = hand({0, 0, 0, 0, 0, 0}, 3, 2, Format::e4m3fn, Scaling::tensor(), {1.0f}, {1, 1});
    std::vector<bf16> wide;
    for (int i = 0; i < 10; ++i) wide.push_back(bf16(float(i)));  // [[0..4], [5..9]]
    GemmOptions o;
    o.beta = 2.0f;
    o.c = Tensor::from(wide, {2, 5}).slice(1, 1, 4);  // [[1, 2, 3], [6, 7, 8]], row stride 5
    for_each_backend([&] { expect_values(gemm(a, b, o), {{2, 4, 6}, {12, 14, 16}}); });
}

// M or N of 0: an empty D, not an error.
TEST(GemmHand, EmptyDimensions) {
    for_each_backend([&] {
        EXPECT_EQ(gemm(q(0, 16), q(5, 16)).shape(), (Shape{0, 5}));
        EXPECT_EQ(gemm(q(3, 16), q(0, 16)).shape(), (Shape{3, 0}));
        EXPECT_EQ(gemm(q(0, 40, Scaling::mx32()), q(0, 40, Scaling::mx32())).shape(), (Shape{0, 0}));
        EXPECT_EQ(gemm(Tensor::zeros({0, 16}, DType::f32), q(5, 16)).shape(), (Shape{0, 5}));  // weight-only
        EXPECT_EQ(gemm(Tensor::zeros({3, 16}, DType::bf16), q(0, 16)).shape(), (Shape{3, 0}));
    });
}

// K = 0: D is the sum over nothing, so alpha * 0 + bias; operands straight from quantize().
TEST(GemmHand, EmptyK) {
    for_each_backend([&] {
        GemmOptions o;
        o.bias = Tensor::from(std::vector<float>{1, 2}, {2});
        expect_values(gemm(q(1, 0, Scaling::tensor()), q(2, 0, Scaling::tensor()), o), {{1, 2}});
        expect_values(gemm(Tensor::zeros({1, 0}, DType::f32), q(2, 0, Scaling::tensor()), o), {{1, 2}});  // weight-only
    });
}

// ---- the K group rule ----

TEST(GemmKGroup, NarrowerExtentOfTheTwoScalings) {
    const Scaling t = Scaling::tensor(), r = Scaling::row(), mx = Scaling::mx32();
    const Scaling b1 = Scaling::block(1, 128), b128 = Scaling::block(128, 128);
    EXPECT_EQ(gemm_k_group(t, t, 1000), 1000);
    EXPECT_EQ(gemm_k_group(r, r, 1000), 1000);
    EXPECT_EQ(gemm_k_group(t, r, 77), 77);
    EXPECT_EQ(gemm_k_group(b1, b128, 1000), 128);
    EXPECT_EQ(gemm_k_group(b128, b128, 1000), 128);
    EXPECT_EQ(gemm_k_group(t, b128, 1000), 128);
    EXPECT_EQ(gemm_k_group(r, b1, 300), 128);
    EXPECT_EQ(gemm_k_group(mx, mx, 1000), 32);
    EXPECT_EQ(gemm_k_group(b1, mx, 1000), 32);
    EXPECT_EQ(gemm_k_group(mx, b128, 1000), 32);
    EXPECT_EQ(gemm_k_group(t, mx, 1000), 32);
    EXPECT_EQ(gemm_k_group(Scaling::block(1, 64), b128, 1000), 64);
    // A block that spans all of K is one group: the group is cut at K.
    EXPECT_EQ(gemm_k_group(b1, b128, 100), 100);
    EXPECT_EQ(gemm_k_group(mx, t, 20), 20);
    // 96 and 128 do not nest (96 does not divide 128), unless one of them covers all of K.
    expect_error([&] { (void)gemm_k_group(Scaling::block(1, 96), b1, 1000); }, "nest");
    expect_error([&] { (void)gemm_k_group(Scaling::block(1, 96), b1, 1000); }, "block(1x96)");
    expect_error([&] { (void)gemm_k_group(mx, Scaling::block(128, 48), 1000); }, "nest");
    // Column scaling scales along K per element: refused, naming the operand.
    expect_error([&] { (void)gemm_k_group(Scaling::column(), t, 64); }, "column");
    expect_error([&] { (void)gemm_k_group(t, Scaling::column(), 64); }, "B");
}

// ---- bad arguments ----

TEST(GemmErrors, KMismatch) {
    const QTensor a = q(4, 64), b = q(5, 32);
    for_each_backend([&] {
        expect_error([&] { (void)gemm(a, b); }, "K mismatch");
        expect_error([&] { (void)gemm(a, b); }, "[4, 64]");
        expect_error([&] { (void)gemm(a, b); }, "[5, 32]");
        expect_error([&] { (void)gemm({normal_matrix(4, 31, 1), qopts(Scaling::row())}, b); }, "K mismatch");
    });
}

TEST(GemmErrors, WrongDtypes) {
    const QTensor b = q(5, 32);
    for_each_backend([&] {
        // A's data not FP8 (f32 values in a QTensor), or its dtype not the format it claims.
        QTensor a = q(4, 32);
        a.data = normal_matrix(4, 32, 3);
        expect_error([&] { (void)gemm(a, b); }, "f32");
        expect_error([&] { (void)gemm(a, b); }, "FP8");
        QTensor scales_as_data = q(4, 32);
        scales_as_data.data = Tensor::zeros({4, 32}, DType::e8m0fnu);
        expect_error([&] { (void)gemm(scales_as_data, b); }, "e8m0fnu");
        // The same for B.
        QTensor bad_b = b;
        bad_b.data = Tensor::zeros({5, 32}, DType::u8);
        expect_error([&] { (void)gemm(q(4, 32), bad_b); }, "B data dtype");
        // A high-precision x that is not f32/bf16/f16, or asked to quantize to e8m0.
        expect_error([&] { (void)gemm({Tensor::zeros({4, 32}, DType::i32), qopts(Scaling::row())}, b); }, "i32");
        expect_error([&] { (void)gemm({Tensor::zeros({4, 32}, DType::e4m3fn), qopts(Scaling::row())}, b); }, "e4m3fn");
        expect_error([&] { (void)gemm({normal_matrix(4, 32, 1), qopts(Scaling::row(), Format::e8m0fnu)}, b); }, "e8m0fnu");
        // C and bias must be f32, bf16 or f16.
        GemmOptions o;
        o.beta = 1.0f;
        o.c = Tensor::zeros({4, 5}, DType::i32);
        expect_error([&] { (void)gemm(q(4, 32), b, o); }, "C dtype");
        GemmOptions ob;
        ob.bias = Tensor::zeros({5}, DType::u8);
        expect_error([&] { (void)gemm(q(4, 32), b, ob); }, "bias dtype");
    });
}

TEST(GemmErrors, ScaleInvOfTheWrongShapeOrType) {
    const QTensor b = q(5, 64);
    for_each_backend([&] {
        QTensor a = q(4, 64);  // row: scale_inv [4, 1]
        a.scale_inv = Tensor::zeros({1, 4}, DType::f32);
        expect_error([&] { (void)gemm(a, b); }, "scale_inv");
        expect_error([&] { (void)gemm(a, b); }, "[4, 1]");
        a.scale_inv = Tensor();
        expect_error([&] { (void)gemm(a, b); }, "scale_inv");
        QTensor mx = q(4, 64, Scaling::mx32());  // [4, 2] e8m0
        mx.scale_inv = Tensor::zeros({4, 2}, DType::f32);
        expect_error([&] { (void)gemm(mx, q(5, 64, Scaling::mx32())); }, "e8m0fnu");
        QTensor blk = q(130, 256, Scaling::block(128, 128));  // [2, 2]
        blk.scale_inv = Tensor::zeros({1, 2}, DType::f32);
        expect_error([&] { (void)gemm(q(3, 256, Scaling::block(1, 128)), blk); }, "[2, 2]");
        expect_error([&] { (void)PackedWeight{blk}; }, "B scale_inv");
    });
}

TEST(GemmErrors, TwoFiveBitExponentOperands) {
    for_each_backend([&] {
        expect_error([&] { (void)gemm(q(4, 32, Scaling::row(), Format::e5m2), q(5, 32, Scaling::row(), Format::e5m2)); }, "e5m2");
        expect_error([&] { (void)gemm({normal_matrix(4, 32, 1), qopts(Scaling::row(), Format::e5m2)},
                                      q(5, 32, Scaling::row(), Format::e5m2)); },
                     "e5m2");
        expect_error([&] { (void)gemm(q(4, 32, Scaling::row(), Format::e5m2fnuz), q(5, 32, Scaling::row(), Format::e5m2)); },
                     "e5m2fnuz");
    });
}

TEST(GemmErrors, ColumnScalingIsRefused) {
    for_each_backend([&] {
        expect_error([&] { (void)gemm(q(4, 32, Scaling::column()), q(5, 32)); }, "column");
        expect_error([&] { (void)gemm(q(4, 32), q(5, 32, Scaling::column())); }, "column");
        expect_error([&] { (void)gemm({normal_matrix(4, 32, 1), qopts(Scaling::column())}, q(5, 32)); }, "column");
        expect_error([&] { (void)PackedWeight{q(5, 32, Scaling::column())}; }, "column");
    });
}

TEST(GemmErrors, NonNestingKGroups) {
    for_each_backend([&] {
        expect_error([&] { (void)gemm(q(4, 300, Scaling::block(1, 96)), q(5, 300, Scaling::block(128, 128))); }, "nest");
    });
}

TEST(GemmErrors, BetaWithoutCAndCOfTheWrongShape) {
    const QTensor a = q(4, 32), b = q(5, 32);
    for_each_backend([&] {
        GemmOptions o;
        o.beta = 0.5f;
        expect_error([&] { (void)gemm(a, b, o); }, "beta");
        expect_error([&] { (void)gemm(a, b, o); }, "no C");
        o.c = Tensor::zeros({5, 4}, DType::f32);
        expect_error([&] { (void)gemm(a, b, o); }, "[5, 4]");
        expect_error([&] { (void)gemm(a, b, o); }, "[4, 5]");
        o.c = Tensor::zeros({4, 5, 1}, DType::f32);
        expect_error([&] { (void)gemm(a, b, o); }, "C ");
        o.c = Tensor();
        expect_error([&] { (void)gemm(a, b, o); }, "C is undefined");
        o.beta = NAN;
        o.c = Tensor::zeros({4, 5}, DType::f32);
        expect_error([&] { (void)gemm(a, b, o); }, "beta");
        o.beta = 0.0f;
        o.alpha = INFINITY;
        expect_error([&] { (void)gemm(a, b, o); }, "alpha");
    });
}

TEST(GemmErrors, BiasOfTheWrongLength) {
    const QTensor a = q(4, 32), b = q(5, 32);
    for_each_backend([&] {
        GemmOptions o;
        o.bias = Tensor::zeros({4}, DType::f32);
        expect_error([&] { (void)gemm(a, b, o); }, "bias");
        expect_error([&] { (void)gemm(a, b, o); }, "[5]");
        o.bias = Tensor::zeros({1, 5}, DType::f32);
        expect_error([&] { (void)gemm(a, b, o); }, "[5]");
    });
}

TEST(GemmErrors, Fp8OutputNeedsGemmQuantized) {
    const QTensor a = q(4, 32), b = q(5, 32);
    for_each_backend([&] {
        for (DType bad : {DType::e4m3fn, DType::e5m2, DType::e8m0fnu, DType::i32, DType::u8}) {
            GemmOptions o;
            o.out_dtype = bad;
            expect_error([&] { (void)gemm(a, b, o); }, "out_dtype");
            expect_error([&] { (void)gemm(a, b, o); }, std::string(to_string(bad)));
        }
        GemmOptions o;
        o.out_dtype = DType::e4m3fn;
        expect_error([&] { (void)gemm(a, b, o); }, "gemm_quantized");
        // gemm_quantized's own options are checked as quantize checks them.
        QuantizeOptions out;
        out.format = Format::e8m0fnu;
        EXPECT_THROW((void)gemm_quantized(a, b, {}, out), Error);
    });
}

TEST(GemmErrors, OperandsMustBeTwoDimensional) {
    const QTensor b = q(5, 32);
    const QTensor a3 = quantize(Tensor::zeros({2, 3, 32}, DType::f32), qopts(Scaling::row()));
    for_each_backend([&] {
        expect_error([&] { (void)gemm(a3, b); }, "2-d");
        expect_error([&] { (void)gemm(a3, b); }, "[2, 3, 32]");
        expect_error([&] { (void)gemm(q(4, 32), a3); }, "B");
        expect_error([&] { (void)PackedWeight{a3}; }, "2-d");
        expect_error([&] { (void)gemm({Tensor::zeros({2, 3, 32}, DType::f32), qopts(Scaling::row())}, b); }, "2-d");
        expect_error([&] { (void)gemm({Tensor::zeros({32}, DType::f32), qopts(Scaling::row())}, b); }, "2-d");
    });
}

TEST(GemmErrors, FusedCastOptions) {
    const QTensor b = q(5, 32);
    const Tensor x = normal_matrix(4, 32, 9);
    for_each_backend([&] {
        QuantizeOptions o = qopts(Scaling::row());
        o.transpose = true;
        expect_error([&] { (void)gemm({x, o}, b); }, "transpose");
        o = qopts(Scaling::row());
        o.amax_epsilon = -1.0f;
        expect_error([&] { (void)gemm({x, o}, b); }, "amax_epsilon");
        expect_error([&] { (void)gemm({Tensor(), qopts(Scaling::row())}, b); }, "A ");
        // NonFinite::error: a NaN or Inf in x throws, naming which.
        Tensor bad = x.clone();
        bad.set({2, 7}, NAN);
        o = qopts(Scaling::row());
        o.non_finite = NonFinite::error;
        expect_error([&] { (void)gemm({bad, o}, b); }, "NaN");
        bad.set({2, 7}, INFINITY);
        expect_error([&] { (void)gemm({bad, o}, b); }, "Inf");
        o.scaling = Scaling::tensor();
        expect_error([&] { (void)gemm({bad, o}, b); }, "Inf");
    });
}

// Weight-only A (a tensor without quantize options): the same checks of A as the fused cast's, and
// none of the FP8 pair rules (A is not FP8: e5m2 B is taken).
TEST(GemmErrors, WeightOnlyA) {
    const QTensor b = q(5, 32);
    for_each_backend([&] {
        expect_error([&] { (void)gemm(Tensor::zeros({4, 32}, DType::i32), b); }, "i32");
        expect_error([&] { (void)gemm(Tensor::zeros({4, 32}, DType::e4m3fn), b); }, "e4m3fn");
        expect_error([&] { (void)gemm(Tensor::zeros({2, 3, 32}, DType::f32), b); }, "2-d");
        expect_error([&] { (void)gemm(Tensor(), b); }, "undefined");
        expect_error([&] { (void)gemm(normal_matrix(4, 31, 1), b); }, "K mismatch");
        const QTensor b_e5m2 = quantize(normal_matrix(5, 32, 2), qopts(Scaling::row(), Format::e5m2));
        EXPECT_EQ(gemm(normal_matrix(4, 32, 1), b_e5m2).shape(), (Shape{4, 5}));
    });
}

}  // namespace
}  // namespace fp8kit::test
