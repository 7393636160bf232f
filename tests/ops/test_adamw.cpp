// tests/ops/test_adamw.cpp: the AdamW update of the cpu backend (float32, in the order of
// <fp8kit/ops.hpp>'s formula) against the reference backend (float64 from the same float32
// inputs, each output rounded once), over sizes with 1, primes and one that runs on several
// threads, a few steps, with and without weight decay, within the bounds of docs/NUMERICS.md
// ("Layer ops"), u = 2^-24, with D = sqrt(v'/c2) + eps and U = lr (m'/c1) / D:
//   m': gamma_3 (|b1 m| + |(1 - b1) g|) + u |m'|        v': gamma_4 (b2 v + (1 - b2) g^2) + u v'
//   p': gamma_3 (|p| + |lr wd p|) + lr gamma_3 (|b1 m| + |(1 - b1) g|) / (c1 D) + gamma_10 |U| + 2u |p'|
// A wrong bias correction (step + 1) is shown to exceed them. The cuda backend (the same order of
// operations in float32) is held to the same bounds when a GPU is present.
#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

using test::gamma;
using test::u32;

struct State {
    Tensor p, m, v;
};

State run_adamw(Backend b, const State& s0, const Tensor& g, const AdamWUpdate& u) {
    return test::on_backend(b, [&] {
        State s{test::moved(s0.p, b).clone(), test::moved(s0.m, b).clone(), test::moved(s0.v, b).clone()};
        adamw_update(s.p, test::moved(g, b), s.m, s.v, u);
        return State{test::host(s.p), test::host(s.m), test::host(s.v)};
    });
}

struct AdamBounds {
    std::vector<double> p, m, v;
};

AdamBounds adamw_bounds(const State& s0, const Tensor& g, const AdamWUpdate& u, const State& ref) {
    const double b1 = u.beta1, b2 = u.beta2, lr = u.lr, wd = u.weight_decay, eps = u.eps;
    const double c1 = 1.0f - std::pow(u.beta1, float(u.step)), c2 = 1.0f - std::pow(u.beta2, float(u.step));
    AdamBounds bd;
    for (int64_t i = 0; i < g.numel(); ++i) {
        const double p = s0.p.data<float>()[i], m = s0.m.data<float>()[i], v = s0.v.data<float>()[i], gi = g.data<float>()[i];
        const double m1 = b1 * m + (1 - b1) * gi, v1 = b2 * v + (1 - b2) * gi * gi;
        const double em = gamma(3) * (std::abs(b1 * m) + std::abs((1 - b1) * gi));
        const double D = std::sqrt(v1 / c2) + eps, U = lr * (m1 / c1) / D;
        bd.m.push_back(em + u32 * std::abs(ref.m.data<float>()[i]));
        bd.v.push_back(gamma(4) * v1 + u32 * std::abs(ref.v.data<float>()[i]));
        bd.p.push_back((gamma(3) * (std::abs(p) + std::abs(lr * wd * p)) + lr * em / (c1 * D) + gamma(10) * std::abs(U) +
                        2 * u32 * std::abs(ref.p.data<float>()[i])) *
                       (1 + 0x1p-10));
    }
    return bd;
}

TEST(AdamWOps, CpuMatchesRefWithinTheBound) {
    const bool on_cuda = test::cuda_part_runs("AdamW on cuda");
    for (int64_t n : {1, 7, 1000, 300007}) {
        for (float wd : {0.0f, 0.1f}) {
            SCOPED_TRACE(::testing::Message() << "n " << n << " wd " << wd);
            State s{test::randn({n}, 1, 0.1), Tensor::zeros({n}, DType::f32), Tensor::zeros({n}, DType::f32)};
            for (int64_t step = 1; step <= 3; ++step) {  // moments from zero, then nonzero
                const Tensor g = test::randn({n}, uint32_t(10 + step), 1e-2);
                const AdamWUpdate u{3e-3f, 0.9f, 0.95f, 1e-8f, wd, step};
                const State ref = run_adamw(Backend::ref, s, g, u);
                const AdamBounds bd = adamw_bounds(s, g, u, ref);
                State first;
                test::for_thread_counts([&](int) {
                    const State cpu = run_adamw(Backend::cpu, s, g, u);
                    test::expect_within("p", cpu.p, ref.p, bd.p);
                    test::expect_within("m", cpu.m, ref.m, bd.m);
                    test::expect_within("v", cpu.v, ref.v, bd.v);
                    if (!first.p.defined()) first = cpu;
                    else test::expect_same("p, threads", cpu.p, first.p);
                });
                if (on_cuda) {
                    const State gpu = run_adamw(Backend::cuda, s, g, u);
                    test::expect_within("p on cuda", gpu.p, ref.p, bd.p);
                    test::expect_within("m on cuda", gpu.m, ref.m, bd.m);
                    test::expect_within("v on cuda", gpu.v, ref.v, bd.v);
                }
                s = ref;
            }
        }
    }
}

TEST(AdamWOps, AWrongBiasCorrectionExceedsTheBound) {
    const int64_t n = 100;
    const State s{test::randn({n}, 1, 0.1), test::randn({n}, 2, 1e-3), test::randn({n}, 3, 1e-3)};
    for (int64_t i = 0; i < n; ++i) s.v.data<float>()[i] = std::abs(s.v.data<float>()[i]);  // a second moment
    const Tensor g = test::randn({n}, 4, 1e-2);
    const AdamWUpdate u{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2};
    const State ref = run_adamw(Backend::ref, s, g, u);
    AdamWUpdate wrong = u;
    wrong.step = 3;
    test::expect_caught("step + 1", run_adamw(Backend::cpu, s, g, wrong).p, ref.p, adamw_bounds(s, g, u, ref).p);
}

TEST(AdamWOps, ErrorsNameTheArgument) {
    const Tensor p = test::randn({4}, 1);
    const Tensor z = Tensor::zeros({4}, DType::f32);
    test::expect_error([&] { adamw_update(p, test::randn({5}, 2), z.clone(), z.clone(), {}); }, "grad is f32 [5], expected f32 [4]");
    test::expect_error([&] { adamw_update(p, z, z.clone(), z.clone(), {.beta1 = 1.0f}); }, "betas in [0, 1)");
    test::expect_error([&] { adamw_update(p, z, z.clone(), z.clone(), {.step = 0}); }, "step >= 1");
}

}  // namespace
}  // namespace fp8kit
