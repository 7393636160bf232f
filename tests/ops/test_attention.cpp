// tests/ops/test_attention.cpp: causal self-attention forward/backward of the cpu backend against
// the reference backend, over batch x time x channels x heads with 1, primes and a size that
// runs on several threads, within the bounds of docs/NUMERICS.md ("Layer ops"), u = 2^-24:
//   att (float64, rounded once by both):  2u |ref| + 2^-50
//   out (the cpu sums the rounded probabilities):  u sum_t2 p |v| + 2u |out| + 2^-45 sum_t2 p |v|
//   dq, dk, dv (float32 sums of n rounded terms):  (gamma_n + u) sum |terms| + 2^-45 (same sum)
// A 0.1% error of the score scale and a dropped time step are shown to exceed them. Causality:
// changing the last position changes no earlier output. The cuda backend (the cpu backend's
// arithmetic) is held to the same bounds (CudaMatchesRefWithinTheBound; skipped, saying why,
// without a GPU).
#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

using test::gamma;
using test::u32;

struct Att {
    Tensor out, att, dqkv;
};

// Forward, then backward from `saved_att` (the reference's probabilities) when given; results on
// the host.
Att run_attention(Backend b, const Tensor& qkv, const Tensor& dout, int64_t nh, const Tensor* saved_att = nullptr) {
    return test::on_backend(b, [&] {
        const int64_t bb = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3;
        const Device d = test::device_of(b);
        const Tensor x = test::moved(qkv, b), g = test::moved(dout, b);
        Att a{Tensor::empty({bb, t, c}, DType::f32, d), Tensor::empty({bb, nh, t, t}, DType::f32, d),
              Tensor::empty(qkv.shape(), DType::f32, d)};
        attention_forward(a.out, a.att, x, nh);
        attention_backward(a.dqkv, g, x, saved_att ? test::moved(*saved_att, b) : a.att, nh);
        return Att{test::host(a.out), test::host(a.att), test::host(a.dqkv)};
    });
}

struct AttBounds {
    std::vector<double> out, att, dqkv;
};

AttBounds attention_bounds(const Tensor& qkv, const Tensor& dout, int64_t nh, const Att& ref) {
    const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hs = C / nh;
    const double scale = 1.0 / std::sqrt(double(hs));
    AttBounds bd;
    for (double a : test::values(ref.att)) bd.att.push_back(2 * u32 * std::abs(a) + 0x1p-50);
    bd.out.assign(size_t(B * T * C), 0.0);
    std::vector<double> mag(size_t(qkv.numel()), 0.0), terms(size_t(qkv.numel()), 0.0);
    auto X = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t i) { return double(qkv.get({b, t, part * C + h * hs + i})); };
    auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t i) { return size_t((b * T + t) * 3 * C + part * C + h * hs + i); };
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < nh; ++h)
            for (int64_t t1 = 0; t1 < T; ++t1) {
                std::vector<double> datt(size_t(t1 + 1));
                double dot_a = 0;
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const double a = ref.att.get({b, h, t1, t2});
                    double s = 0;
                    for (int64_t i = 0; i < hs; ++i) {
                        const double g = dout.get({b, t1, h * hs + i});
                        s += g * X(b, t2, 2, h, i);
                        mag[at(b, t2, 2, h, i)] += std::abs(a * g);  // dv[t2] += a g
                        terms[at(b, t2, 2, h, i)] += 1;
                        bd.out[size_t((b * T + t1) * C + h * hs + i)] += std::abs(a * X(b, t2, 2, h, i));
                    }
                    datt[size_t(t2)] = s;
                    dot_a += a * s;
                }
                for (int64_t t2 = 0; t2 <= t1; ++t2) {
                    const double ds = ref.att.get({b, h, t1, t2}) * (datt[size_t(t2)] - dot_a) * scale;
                    for (int64_t i = 0; i < hs; ++i) {
                        mag[at(b, t1, 0, h, i)] += std::abs(ds * X(b, t2, 1, h, i));  // dq[t1] += ds k[t2]
                        terms[at(b, t1, 0, h, i)] += 1;
                        mag[at(b, t2, 1, h, i)] += std::abs(ds * X(b, t1, 0, h, i));  // dk[t2] += ds q[t1]
                        terms[at(b, t2, 1, h, i)] += 1;
                    }
                }
            }
    const std::vector<double> out = test::values(ref.out);
    for (size_t i = 0; i < out.size(); ++i) bd.out[i] = (u32 + 0x1p-45) * bd.out[i] * (1 + 0x1p-20) + 2 * u32 * std::abs(out[i]);
    for (size_t i = 0; i < mag.size(); ++i) bd.dqkv.push_back((gamma(int64_t(terms[i])) + u32 + 0x1p-45) * mag[i] * (1 + 0x1p-20));
    return bd;
}

void expect_attention_within(const Att& cpu, const Att& ref, const AttBounds& bd) {
    test::expect_within("att", cpu.att, ref.att, bd.att);
    test::expect_within("out", cpu.out, ref.out, bd.out);
    test::expect_within("dqkv", cpu.dqkv, ref.dqkv, bd.dqkv);
}

TEST(AttentionOps, CpuMatchesRefWithinTheBound) {
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {1, 5, 6, 2}, {2, 7, 15, 3}, {1, 17, 32, 4}, {5, 128, 64, 4}};  // B, T, C, NH; the last runs on several threads
    for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << "B " << s[0] << " T " << s[1] << " C " << s[2] << " NH " << s[3]);
        const Tensor qkv = test::randn({s[0], s[1], 3 * s[2]}, 1), dout = test::randn({s[0], s[1], s[2]}, 2);
        const Att ref = run_attention(Backend::ref, qkv, dout, s[3]);
        const AttBounds bd = attention_bounds(qkv, dout, s[3], ref);
        Att first;
        test::for_thread_counts([&](int) {
            const Att cpu = run_attention(Backend::cpu, qkv, dout, s[3], &ref.att);
            expect_attention_within(cpu, ref, bd);
            if (!first.out.defined()) {
                first = cpu;
                return;
            }
            test::expect_same("out, threads", cpu.out, first.out);
            test::expect_same("dqkv, threads", cpu.dqkv, first.dqkv);
        });
    }
}

// The cuda backend on the same shapes and bounds (one warp per (batch, head, step); T = 128
// spans four 32-step chunks of the backward's loops).
TEST(AttentionOps, CudaMatchesRefWithinTheBound) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {1, 5, 6, 2}, {2, 7, 15, 3}, {1, 17, 32, 4}, {5, 128, 64, 4}, {1, 40, 192, 2}};
    for (const auto& s : shapes) {
        SCOPED_TRACE(::testing::Message() << "B " << s[0] << " T " << s[1] << " C " << s[2] << " NH " << s[3]);
        const Tensor qkv = test::randn({s[0], s[1], 3 * s[2]}, 1), dout = test::randn({s[0], s[1], s[2]}, 2);
        const Att ref = run_attention(Backend::ref, qkv, dout, s[3]);
        expect_attention_within(run_attention(Backend::cuda, qkv, dout, s[3], &ref.att), ref,
                                attention_bounds(qkv, dout, s[3], ref));
    }
}

TEST(AttentionOps, PlantedErrorsExceedTheBound) {
    const int64_t nh = 2;
    const Tensor qkv = test::randn({1, 9, 3 * 8}, 1), dout = test::randn({1, 9, 8}, 2);
    const Att ref = run_attention(Backend::ref, qkv, dout, nh);
    const AttBounds bd = attention_bounds(qkv, dout, nh, ref);
    // Scores scaled by 1.001 (as a wrong 1 / sqrt(head size) would): q scaled.
    Tensor q_scaled = qkv.clone();
    for (int64_t t = 0; t < 9; ++t)
        for (int64_t i = 0; i < 8; ++i) q_scaled.set({0, t, i}, q_scaled.get({0, t, i}) * 1.001f);
    const Att scaled = run_attention(Backend::cpu, q_scaled, dout, nh);
    test::expect_caught("scale: att", scaled.att, ref.att, bd.att);
    test::expect_caught("scale: out", scaled.out, ref.out, bd.out);
    // The last time step's gradient dropped.
    Tensor dropped = dout.clone();
    for (int64_t i = 0; i < 8; ++i) dropped.set({0, 8, i}, 0.0f);
    test::expect_caught("dropped step: dqkv", run_attention(Backend::cpu, qkv, dropped, nh, &ref.att).dqkv, ref.dqkv, bd.dqkv);
}

TEST(AttentionOps, IsCausal) {
    // Changing the last position's q, k, v changes no earlier output, on either backend.
    const int64_t t = 4, c = 4;
    Tensor qkv = test::randn({1, t, 3 * c}, 1, 1.0, DType::f64);
    for (Backend b : available_backends()) {
        SCOPED_TRACE(std::string(to_string(b)));
        test::on_backend(b, [&] {
            Tensor att = Tensor::empty({1, 1, t, t}, DType::f64), out1 = Tensor::empty({1, t, c}, DType::f64);
            Tensor out2 = Tensor::empty({1, t, c}, DType::f64), changed = qkv.clone();
            attention_forward(out1, att, qkv, 1);
            for (int64_t i = 0; i < 3 * c; ++i) changed.data<double>()[(t - 1) * 3 * c + i] += 1.0;
            attention_forward(out2, att, changed, 1);
            for (int64_t i = 0; i < (t - 1) * c; ++i) EXPECT_EQ(out1.data<double>()[i], out2.data<double>()[i]);
            return 0;
        });
    }
}

TEST(AttentionOps, ErrorsNameTheArgument) {
    const Tensor qkv = test::randn({1, 3, 12}, 1);
    Tensor out = Tensor::empty({1, 3, 4}, DType::f32), att = Tensor::empty({1, 2, 3, 3}, DType::f32);
    test::expect_error([&] { attention_forward(out, att, qkv, 3); }, "heads is 3, expected a divisor of C = 4");
    test::expect_error([&] { attention_forward(out, att, test::randn({3, 12}, 1), 2); }, "qkv is f32 [3, 12], expected [B, T, 3C]");
    test::expect_error([&] { attention_forward(out, Tensor::empty({1, 2, 3, 2}, DType::f32), qkv, 2); }, "att is f32 [1, 2, 3, 2], expected f32 [1, 2, 3, 3]");
}

}  // namespace
}  // namespace fp8kit
