// tests/ops/test_residual.cpp: the residual add, out = inp + residual (the residual inp's shape or
// its trailing dimensions, broadcast over the leading ones), on the cpu and cuda backends (cuda:
// skipped, saying why, without a GPU) against the reference backend bit for bit: one addition
// rounded once has one right answer (the reference's float64 sum rounded to float32 is the float32
// sum: float64 has more than twice float32's precision), so any difference - a wrong broadcast, a
// skipped element, an extra rounding - fails. Also in place (out is inp), f64, shapes with 1 and
// primes, inputs of every magnitude (sums that cancel, round, overflow to Inf), and the errors.
#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

// Values of every magnitude: N(0, 1) scaled by 2^e, e in [-30, 30], some near float32's max.
Tensor values(const Shape& shape, uint32_t seed, DType dtype = DType::f32) {
    Tensor t = test::randn(shape, seed, 1.0, dtype);
    std::mt19937 rng(seed + 100);
    std::uniform_int_distribution<int> e(-30, 30);
    for (int64_t i = 0; i < t.numel(); ++i) {
        const double v = std::ldexp(dtype == DType::f64 ? t.data<double>()[i] : double(t.data<float>()[i]), e(rng));
        const double big = i % 97 == 5 ? 3.0e38 : v;  // sums of two such overflow to +-Inf
        if (dtype == DType::f64) t.data<double>()[i] = big;
        else t.data<float>()[i] = float(big);
    }
    return t;
}

Tensor run_residual(Backend b, const Tensor& x, const Tensor& r, bool in_place) {
    return test::on_backend(b, [&] {
        const Tensor xb = test::moved(x, b), rb = test::moved(r, b);
        const Tensor out = in_place ? xb.clone() : Tensor::empty(x.shape(), x.dtype(), test::device_of(b));
        residual_forward(out, in_place ? out : xb, rb);
        return test::host(out);
    });
}

std::vector<Backend> fast_backends() {
    std::vector<Backend> b{Backend::cpu};
    if (test::cuda_part_runs("the residual add on cuda")) b.push_back(Backend::cuda);
    return b;
}

TEST(ResidualOps, EveryBackendEqualsRefBitForBit) {
    const Shape cases[][2] = {{{1}, {1}},         {{7}, {7}},         {{5, 3}, {5, 3}},   {{5, 3}, {3}},
                              {{4, 6, 10}, {6, 10}}, {{2, 31, 17}, {17}}, {{3, 1, 5}, {1, 5}}, {{600, 521}, {521}},
                              {{6, 7}, {}}};
    for (Backend be : fast_backends()) {
        for (const auto& c : cases) {
            for (DType dt : {DType::f32, DType::f64}) {
                for (bool in_place : {false, true}) {
                    SCOPED_TRACE(::testing::Message() << to_string(be) << " inp " << to_string(c[0]) << " residual "
                                                      << to_string(c[1]) << " " << to_string(dt) << (in_place ? " in place" : ""));
                    const Tensor x = values(c[0], 1, dt), r = values(c[1], 2, dt);
                    const Tensor ref = run_residual(Backend::ref, x, r, in_place);
                    test::expect_same("out", run_residual(be, x, r, in_place), ref);
                }
            }
        }
    }
}

// The reference itself, element by element against a float64 sum rounded to float32 (what a
// float32 addition gives): the broadcast runs over the leading dimensions, not the trailing ones.
TEST(ResidualOps, RefBroadcastsOverTheLeadingDimensions) {
    const Tensor x = values({3, 4, 5}, 3), r = values({4, 5}, 4);
    const Tensor out = run_residual(Backend::ref, x, r, false);
    for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 4; ++j)
            for (int64_t k = 0; k < 5; ++k) {
                const float want = x.get({i, j, k}) + r.get({j, k});
                EXPECT_EQ(test::bits(out.get({i, j, k})), test::bits(want)) << i << "," << j << "," << k;
            }
}

TEST(ResidualOps, ErrorsNameTheArgument) {
    const Tensor x = test::randn({4, 6}, 1);
    Tensor out = Tensor::empty({4, 6}, DType::f32);
    test::expect_error([&] { residual_forward(out, x, test::randn({4}, 2)); }, "residual is f32 [4], expected inp's shape [4, 6]");
    test::expect_error([&] { residual_forward(out, x, test::randn({2, 4, 6}, 2)); }, "residual is f32 [2, 4, 6]");
    test::expect_error([&] { residual_forward(out, x, Tensor()); }, "residual is undefined");
    test::expect_error([&] { residual_forward(out, x, test::randn({6}, 2, 1.0, DType::f64)); }, "residual is f64 [6], expected f32 [6]");
    test::expect_error([&] { residual_forward(Tensor::empty({4, 5}, DType::f32), x, test::randn({6}, 2)); }, "out is f32 [4, 5], expected f32 [4, 6]");
    test::expect_error([&] { residual_forward(out, Tensor::zeros({4, 6}, DType::i32), test::randn({6}, 2)); }, "inp is i32 [4, 6]");
}

}  // namespace
}  // namespace fp8kit
