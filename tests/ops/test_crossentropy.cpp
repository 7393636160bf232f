// tests/ops/test_crossentropy.cpp: softmax cross-entropy forward/backward of the cpu backend
// against the reference backend, over rows x vocabulary with 1, primes and a size that runs on
// several threads, within the bounds of docs/NUMERICS.md ("Layer ops"), u = 2^-24:
//   probs, losses (float64, rounded once by both):  2u |ref| + 2^-50 (|log sum| + |max - z_target|)
//   dlogits = fl(fl(p - y) dloss) against one rounding:  3u |(p - y) dloss|
// A dropped term of the softmax sum and a gradient without the one-hot are shown to exceed them.
// The cuda backend is held to the same bounds (CudaMatchesRefWithinTheBound; skipped, saying why,
// without a GPU).
#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

using test::u32;

struct Ce {
    Tensor losses, probs, dlogits;
};

// Results on the host.
Ce run_ce(Backend b, const Tensor& logits, const Tensor& targets, float dloss, const Tensor* saved_probs = nullptr) {
    return test::on_backend(b, [&] {
        const int64_t rows = logits.size(0), v = logits.size(1);
        const Device d = test::device_of(b);
        const Tensor z = test::moved(logits, b), t = test::moved(targets, b);
        Ce c{Tensor::empty({rows}, DType::f32, d), Tensor::empty({rows, v}, DType::f32, d), Tensor::empty({rows, v}, DType::f32, d)};
        crossentropy_forward(c.losses, c.probs, z, t);
        crossentropy_backward(c.dlogits, saved_probs ? test::moved(*saved_probs, b) : c.probs, t, dloss);
        return Ce{test::host(c.losses), test::host(c.probs), test::host(c.dlogits)};
    });
}

Tensor make_targets(int64_t rows, int64_t v) {
    Tensor t = Tensor::empty({rows}, DType::i32);
    for (int64_t r = 0; r < rows; ++r) t.data<int32_t>()[r] = int32_t((r * 7919) % std::max<int64_t>(v - 1, 1));  // never the last column when v > 1
    return t;
}

struct CeBounds {
    std::vector<double> losses, probs, dlogits;
};

CeBounds ce_bounds(const Tensor& logits, const Tensor& targets, float dloss, const Ce& ref) {
    const int64_t rows = logits.size(0), v = logits.size(1);
    CeBounds b;
    for (int64_t r = 0; r < rows; ++r) {
        double maxv = -INFINITY, sum = 0;
        for (int64_t i = 0; i < v; ++i) maxv = std::max(maxv, double(logits.get({r, i})));
        for (int64_t i = 0; i < v; ++i) sum += std::exp(double(logits.get({r, i})) - maxv);
        const int32_t tr = targets.data<int32_t>()[r];
        b.losses.push_back(2 * u32 * std::abs(ref.losses.get({r})) + 0x1p-50 * (std::abs(std::log(sum)) + maxv - logits.get({r, tr})));
        for (int64_t i = 0; i < v; ++i) {
            const double p = ref.probs.get({r, i});
            b.probs.push_back(2 * u32 * p + 0x1p-50);
            b.dlogits.push_back(3 * u32 * std::abs((p - (i == tr ? 1.0 : 0.0)) * double(dloss)));
        }
    }
    return b;
}

void expect_ce_within(const Ce& got, const Ce& ref, const CeBounds& bd) {
    test::expect_within("losses", got.losses, ref.losses, bd.losses);
    test::expect_within("probs", got.probs, ref.probs, bd.probs);
    test::expect_within("dlogits", got.dlogits, ref.dlogits, bd.dlogits);
}

TEST(CrossEntropyOps, CpuMatchesRefWithinTheBound) {
    const int64_t shapes[][2] = {{1, 1}, {1, 2}, {5, 17}, {13, 256}, {7, 1031}, {300, 1000}};
    for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << s[0] << "x" << s[1]);
        const Tensor logits = test::randn({s[0], s[1]}, 1, 3.0), targets = make_targets(s[0], s[1]);
        const float dloss = 1.0f / float(s[0]);
        const Ce ref = run_ce(Backend::ref, logits, targets, dloss);
        const CeBounds bd = ce_bounds(logits, targets, dloss, ref);
        Ce first;
        test::for_thread_counts([&](int) {
            const Ce cpu = run_ce(Backend::cpu, logits, targets, dloss, &ref.probs);
            expect_ce_within(cpu, ref, bd);
            if (!first.probs.defined()) first = cpu;
            else test::expect_same("probs, threads", cpu.probs, first.probs);
        });
    }
}

// The cuda backend (one block a row) on the same shapes and a vocabulary of GPT-2's size.
TEST(CrossEntropyOps, CudaMatchesRefWithinTheBound) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const int64_t shapes[][2] = {{1, 1}, {1, 2}, {5, 17}, {13, 256}, {7, 1031}, {300, 1000}, {3, 50257}};
    for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << s[0] << "x" << s[1]);
        const Tensor logits = test::randn({s[0], s[1]}, 1, 3.0), targets = make_targets(s[0], s[1]);
        const float dloss = 1.0f / float(s[0]);
        const Ce ref = run_ce(Backend::ref, logits, targets, dloss);
        expect_ce_within(run_ce(Backend::cuda, logits, targets, dloss, &ref.probs), ref, ce_bounds(logits, targets, dloss, ref));
    }
}

TEST(CrossEntropyOps, PlantedErrorsExceedTheBound) {
    const int64_t rows = 6, v = 50;
    const Tensor logits = test::randn({rows, v}, 1, 3.0), targets = make_targets(rows, v);
    const Ce ref = run_ce(Backend::ref, logits, targets, 0.5f);
    const CeBounds bd = ce_bounds(logits, targets, 0.5f, ref);
    // The last logit of every row left out of the softmax sum (exp(-inf) = 0).
    Tensor dropped = logits.clone();
    for (int64_t r = 0; r < rows; ++r) dropped.set({r, v - 1}, -INFINITY);
    const Ce wrong = run_ce(Backend::cpu, dropped, targets, 0.5f);
    test::expect_caught("dropped term: probs", wrong.probs, ref.probs, bd.probs);
    test::expect_caught("dropped term: losses", wrong.losses, ref.losses, bd.losses);
    // The gradient p * dloss, without the one-hot.
    Tensor no_onehot = ref.probs.clone();
    for (int64_t i = 0; i < no_onehot.numel(); ++i) no_onehot.data<float>()[i] *= 0.5f;
    test::expect_caught("no one-hot", no_onehot, ref.dlogits, bd.dlogits);
}

TEST(CrossEntropyOps, ErrorsNameTheArgument) {
    const Tensor logits = test::randn({3, 5}, 1);
    Tensor losses = Tensor::empty({3}, DType::f32), probs = Tensor::empty({3, 5}, DType::f32);
    Tensor bad = Tensor::from(std::vector<int32_t>{0, 5, 1}, {3});
    test::expect_error([&] { crossentropy_forward(losses, probs, logits, bad); }, "targets[1] is 5, expected a value in [0, 5)");
    test::expect_error([&] { crossentropy_forward(losses, probs, logits, Tensor::zeros({2}, DType::i32)); }, "one per row of logits");
    test::expect_error([&] { crossentropy_backward(probs, probs, Tensor::zeros({3}, DType::i32), NAN); }, "dloss is nan");
}

}  // namespace
}  // namespace fp8kit
