// tests/nn/test_ops.cpp: every <op>_backward of src/nn/ops.hpp against central finite differences
// of its <op>_forward, in float64 (the ops are templated; double makes the difference quotient
// accurate to ~1e-9, so a wrong term in a backward cannot hide in rounding). The reference
// backend is active throughout. ops::matmul (float32 and float64, every transpose) is checked
// against a float64 triple loop.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "fp8kit/backend.hpp"
#include "nn/ops.hpp"

namespace fp8kit::nn::ops {
namespace {

using Vec = std::vector<double>;

Vec randn(size_t n, uint64_t seed, double scale = 1.0) {
    std::mt19937_64 g(seed);
    std::normal_distribution<double> d(0.0, scale);
    Vec v(n);
    for (auto& x : v) x = d(g);
    return v;
}

double dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// loss() is a scalar function of x (x is perturbed in place); grad the analytic dloss/dx.
// Central differences with step h; the error of the quotient is O(h^2) ~ 1e-10 relative.
void expect_grad(const char* what, Vec& x, const Vec& grad, const std::function<double()>& loss) {
    ASSERT_EQ(x.size(), grad.size()) << what;
    const double h = 1e-5;
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double keep = x[i];
        x[i] = keep + h;
        const double lp = loss();
        x[i] = keep - h;
        const double lm = loss();
        x[i] = keep;
        const double num = (lp - lm) / (2 * h);
        const double err = std::abs(num - grad[i]) / std::max(1.0, std::abs(num));
        worst = std::max(worst, err);
        EXPECT_NEAR(grad[i], num, 1e-6 * std::max(1.0, std::abs(num))) << what << "[" << i << "]";
        if (err > 1e-6) return;  // one failure says enough
    }
    ::testing::Test::RecordProperty(what, std::to_string(worst));
}

class Ops : public ::testing::Test {
protected:
    void SetUp() override { use_.emplace(Backend::ref); }
    void TearDown() override { use_.reset(); }
    std::optional<BackendOverride> use_;
};

TEST_F(Ops, MatmulMatchesTripleLoopForEveryTranspose) {
    for (int64_t m : {1, 5, 17}) {
        for (int64_t n : {1, 7, 33}) {
            for (int64_t k : {1, 3, 40}) {
                const Vec a = randn(static_cast<size_t>(m * k), 1), b = randn(static_cast<size_t>(k * n), 2), c0 = randn(static_cast<size_t>(m * n), 3);
                for (Trans ta : {Trans::no, Trans::yes}) {
                    for (Trans tb : {Trans::no, Trans::yes}) {
                        auto A = [&](int64_t i, int64_t p) { return ta == Trans::no ? a[size_t(i * k + p)] : a[size_t(p * m + i)]; };
                        auto B = [&](int64_t p, int64_t j) { return tb == Trans::no ? b[size_t(p * n + j)] : b[size_t(j * k + p)]; };
                        for (bool acc : {false, true}) {
                            Vec c = c0;
                            std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(c0.begin(), c0.end());
                            matmul(c.data(), a.data(), ta, b.data(), tb, m, n, k, acc);
                            matmul(cf.data(), af.data(), ta, bf.data(), tb, m, n, k, acc);
                            for (int64_t i = 0; i < m; ++i)
                                for (int64_t j = 0; j < n; ++j) {
                                    double ref = acc ? c0[size_t(i * n + j)] : 0.0, mag = std::abs(ref);
                                    for (int64_t p = 0; p < k; ++p) {
                                        ref += A(i, p) * B(p, j);
                                        mag += std::abs(A(i, p) * B(p, j));
                                    }
                                    ASSERT_NEAR(c[size_t(i * n + j)], ref, 1e-12 * mag + 1e-300);
                                    // float32: k + 1 roundings of terms of at most mag (plus the
                                    // inputs' own rounding to float32: 2 more per product)
                                    ASSERT_NEAR(double(cf[size_t(i * n + j)]), ref, double(k + 4) * 0x1p-24 * mag);
                                }
                        }
                    }
                }
            }
        }
    }
}

TEST_F(Ops, LinearBackward) {
    const int64_t rows = 5, in = 7, oc = 3;
    Vec x = randn(static_cast<size_t>(rows * in), 1), w = randn(static_cast<size_t>(oc * in), 2), b = randn(static_cast<size_t>(oc), 3);
    const Vec r = randn(static_cast<size_t>(rows * oc), 4);
    auto loss = [&] {
        Vec out(static_cast<size_t>(rows * oc));
        linear_forward(out.data(), x.data(), w.data(), b.data(), rows, in, oc);
        return dot(out, r);
    };
    Vec dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
    linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), rows, in, oc);
    expect_grad("dx", x, dx, loss);
    expect_grad("dw", w, dw, loss);
    expect_grad("db", b, db, loss);
}

TEST_F(Ops, LayerNormBackward) {
    const int64_t rows = 4, c = 9;
    Vec x = randn(static_cast<size_t>(rows * c), 1, 2.0), w = randn(static_cast<size_t>(c), 2), b = randn(static_cast<size_t>(c), 3);
    const Vec r = randn(static_cast<size_t>(rows * c), 4);
    Vec mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
    auto loss = [&] {
        Vec out(static_cast<size_t>(rows * c));
        layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, c);
        return dot(out, r);
    };
    loss();
    Vec dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
    layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, c);
    expect_grad("dx", x, dx, loss);
    expect_grad("dw", w, dw, loss);
    expect_grad("db", b, db, loss);
}

TEST_F(Ops, RMSNormBackward) {
    const int64_t rows = 4, c = 9;
    Vec x = randn(static_cast<size_t>(rows * c), 1, 2.0), w = randn(static_cast<size_t>(c), 2);
    const Vec r = randn(static_cast<size_t>(rows * c), 4);
    Vec rstd(static_cast<size_t>(rows));
    auto loss = [&] {
        Vec out(static_cast<size_t>(rows * c));
        rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, c);
        return dot(out, r);
    };
    loss();
    Vec dx(x.size()), dw(w.size(), 0.0);
    rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, c);
    expect_grad("dx", x, dx, loss);
    expect_grad("dw", w, dw, loss);
}

TEST_F(Ops, GeluBackward) {
    const int64_t n = 50;
    Vec x = randn(static_cast<size_t>(n), 1, 3.0);
    const Vec r = randn(static_cast<size_t>(n), 2);
    auto loss = [&] {
        Vec out(static_cast<size_t>(n));
        gelu_forward(out.data(), x.data(), n);
        return dot(out, r);
    };
    Vec dx(x.size());
    gelu_backward(dx.data(), x.data(), r.data(), n);
    expect_grad("dx", x, dx, loss);
}

TEST_F(Ops, AttentionBackward) {
    const int64_t b = 2, t = 5, c = 8, nh = 2;
    Vec qkv = randn(static_cast<size_t>(b * t * 3 * c), 1);
    const Vec r = randn(static_cast<size_t>(b * t * c), 2);
    Vec att(static_cast<size_t>(b * nh * t * t));
    auto loss = [&] {
        Vec out(static_cast<size_t>(b * t * c));
        attention_forward(out.data(), att.data(), qkv.data(), b, t, c, nh);
        return dot(out, r);
    };
    loss();
    Vec dqkv(qkv.size());
    attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), b, t, c, nh);
    expect_grad("dqkv", qkv, dqkv, loss);
}

TEST_F(Ops, AttentionIsCausal) {
    // Changing the last position's q, k, v changes no earlier output.
    const int64_t b = 1, t = 4, c = 4, nh = 1;
    Vec qkv = randn(static_cast<size_t>(b * t * 3 * c), 1);
    Vec att(static_cast<size_t>(t * t)), out1(static_cast<size_t>(t * c)), out2(static_cast<size_t>(t * c));
    attention_forward(out1.data(), att.data(), qkv.data(), b, t, c, nh);
    for (int64_t i = 0; i < 3 * c; ++i) qkv[size_t((t - 1) * 3 * c + i)] += 1.0;
    attention_forward(out2.data(), att.data(), qkv.data(), b, t, c, nh);
    for (int64_t i = 0; i < (t - 1) * c; ++i) EXPECT_EQ(out1[static_cast<size_t>(i)], out2[static_cast<size_t>(i)]);
}

TEST_F(Ops, EmbeddingBackward) {
    const int64_t v = 6, c = 3, rows = 7;
    Vec table = randn(static_cast<size_t>(v * c), 1);
    const std::vector<int32_t> ids{0, 3, 3, 5, 1, 0, 3};  // repeats: gradients must add up
    const Vec r = randn(static_cast<size_t>(rows * c), 2);
    auto loss = [&] {
        Vec out(static_cast<size_t>(rows * c));
        embedding_forward(out.data(), ids.data(), table.data(), rows, c);
        return dot(out, r);
    };
    Vec dt(table.size(), 0.0);
    embedding_backward(dt.data(), r.data(), ids.data(), rows, c);
    expect_grad("dtable", table, dt, loss);
}

TEST_F(Ops, CrossEntropyBackward) {
    const int64_t rows = 4, v = 11;
    Vec z = randn(static_cast<size_t>(rows * v), 1, 3.0);
    const std::vector<int32_t> targets{0, 10, 4, 4};
    const double dloss = 0.7;
    Vec probs(z.size());
    auto loss = [&] {
        Vec losses(static_cast<size_t>(rows));
        crossentropy_forward(losses.data(), probs.data(), z.data(), targets.data(), rows, v);
        double s = 0;
        for (double l : losses) s += l;
        return dloss * s;
    };
    loss();
    Vec dz(z.size());
    crossentropy_backward(dz.data(), probs.data(), targets.data(), dloss, rows, v);
    expect_grad("dlogits", z, dz, loss);
}

}  // namespace
}  // namespace fp8kit::nn::ops
