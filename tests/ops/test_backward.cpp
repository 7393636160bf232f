// tests/ops/test_backward.cpp: every <op>_backward of <fp8kit/ops.hpp> against central finite
// differences of its <op>_forward, on f64 tensors (every op takes f64; float64 makes the
// difference quotient accurate to ~1e-9, so a wrong term in a backward cannot hide in rounding),
// on every backend. The f32 results are compared with the reference backend by the per-family
// tests beside this one.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.hpp"
#include "fp8kit/ops.hpp"
#include "support.hpp"

namespace fp8kit {
namespace {

Tensor randn(const Shape& shape, uint64_t seed, double scale = 1.0) {
    std::mt19937_64 g(seed);
    std::normal_distribution<double> d(0.0, scale);
    Tensor t = Tensor::empty(shape, DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(g);
    return t;
}

Tensor zeros(const Shape& shape) { return Tensor::zeros(shape, DType::f64); }

double dot(const Tensor& a, const Tensor& b) {
    double s = 0;
    for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
    return s;
}

// loss() is a scalar function of x (x is perturbed in place); grad the analytic dloss/dx.
// Central differences with step h; the error of the quotient is O(h^2) ~ 1e-10 relative.
void expect_grad(const char* what, const Tensor& x, const Tensor& grad, const std::function<double()>& loss) {
    ASSERT_EQ(x.numel(), grad.numel()) << what;
    const double h = 1e-5;
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
        const double keep = p[i];
        p[i] = keep + h;
        const double lp = loss();
        p[i] = keep - h;
        const double lm = loss();
        p[i] = keep;
        const double num = (lp - lm) / (2 * h), got = grad.data<double>()[i];
        if (std::abs(num - got) > 1e-6 * std::max(1.0, std::abs(num))) {
            ADD_FAILURE() << what << "[" << i << "]: backward " << got << ", finite difference " << num;
            return;  // one failure says enough
        }
    }
}

// body() once per backend (ref, then cpu), that backend active.
template <class Body>
void on_each_backend(Body&& body) {
    for (Backend b : available_backends()) {
        SCOPED_TRACE("backend " + std::string(to_string(b)));
        test::on_backend(b, [&] {
            body();
            return 0;
        });
    }
}

TEST(Backward, Linear) {
    on_each_backend([] {
        const int64_t rows = 5, in = 7, oc = 3;
        const Tensor x = randn({rows, in}, 1), w = randn({oc, in}, 2), b = randn({oc}, 3), r = randn({rows, oc}, 4);
        auto loss = [&] {
            Tensor out = zeros({rows, oc});
            linear_forward(out, x, w, b);
            return dot(out, r);
        };
        Tensor dx = zeros({rows, in}), dw = zeros({oc, in}), db = zeros({oc});
        linear_backward(dx, dw, db, r, x, w);
        expect_grad("dx", x, dx, loss);
        expect_grad("dw", w, dw, loss);
        expect_grad("db", b, db, loss);
    });
}

TEST(Backward, MatmulEveryTranspose) {
    on_each_backend([] {
        const int64_t m = 3, n = 4, k = 5;
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, 1), b = randn(tb ? Shape{n, k} : Shape{k, n}, 2);
                const Tensor r = randn({m, n}, 3);
                auto loss = [&] {
                    Tensor out = zeros({m, n});
                    matmul(out, a, b, {.transpose_a = ta, .transpose_b = tb});
                    return dot(out, r);
                };
                // d/da sum r . op(a) op(b) = r op(b)^T (transposed back when a is stored [k, m]).
                Tensor da = zeros(a.shape()), db = zeros(b.shape());
                if (ta) matmul(da, b, r, {.transpose_a = tb, .transpose_b = true});
                else matmul(da, r, b, {.transpose_b = !tb});
                if (tb) matmul(db, r, a, {.transpose_a = true, .transpose_b = ta});
                else matmul(db, a, r, {.transpose_a = !ta});
                expect_grad("da", a, da, loss);
                expect_grad("db", b, db, loss);
            }
    });
}

TEST(Backward, LayerNorm) {
    on_each_backend([] {
        const int64_t rows = 4, c = 9;
        const Tensor x = randn({rows, c}, 1, 2.0), w = randn({c}, 2), b = randn({c}, 3), r = randn({rows, c}, 4);
        Tensor mean = zeros({rows}), rstd = zeros({rows});
        auto loss = [&] {
            Tensor out = zeros({rows, c});
            layernorm_forward(out, mean, rstd, x, w, b);
            return dot(out, r);
        };
        loss();
        Tensor dx = zeros({rows, c}), dw = zeros({c}), db = zeros({c});
        layernorm_backward(dx, dw, db, r, x, w, mean, rstd);
        expect_grad("dx", x, dx, loss);
        expect_grad("dw", w, dw, loss);
        expect_grad("db", b, db, loss);
    });
}

TEST(Backward, RMSNorm) {
    on_each_backend([] {
        const int64_t rows = 4, c = 9;
        const Tensor x = randn({rows, c}, 1, 2.0), w = randn({c}, 2), r = randn({rows, c}, 4);
        Tensor rstd = zeros({rows});
        auto loss = [&] {
            Tensor out = zeros({rows, c});
            rmsnorm_forward(out, rstd, x, w);
            return dot(out, r);
        };
        loss();
        Tensor dx = zeros({rows, c}), dw = zeros({c});
        rmsnorm_backward(dx, dw, r, x, w, rstd);
        expect_grad("dx", x, dx, loss);
        expect_grad("dw", w, dw, loss);
    });
}

TEST(Backward, Gelu) {
    on_each_backend([] {
        const int64_t n = 50;
        const Tensor x = randn({n}, 1, 3.0), r = randn({n}, 2);
        auto loss = [&] {
            Tensor out = zeros({n});
            gelu_forward(out, x);
            return dot(out, r);
        };
        Tensor dx = zeros({n});
        gelu_backward(dx, x, r);
        expect_grad("dx", x, dx, loss);
    });
}

TEST(Backward, Attention) {
    on_each_backend([] {
        const int64_t b = 2, t = 5, c = 8, nh = 2;
        const Tensor qkv = randn({b, t, 3 * c}, 1), r = randn({b, t, c}, 2);
        Tensor att = zeros({b, nh, t, t});
        auto loss = [&] {
            Tensor out = zeros({b, t, c});
            attention_forward(out, att, qkv, nh);
            return dot(out, r);
        };
        loss();
        Tensor dqkv = zeros({b, t, 3 * c});
        attention_backward(dqkv, r, qkv, att, nh);
        expect_grad("dqkv", qkv, dqkv, loss);
    });
}

TEST(Backward, Embedding) {
    on_each_backend([] {
        const int64_t v = 6, c = 3, rows = 7;
        const Tensor table = randn({v, c}, 1), r = randn({rows, c}, 2);
        const Tensor ids = Tensor::from(std::vector<int32_t>{0, 3, 3, 5, 1, 0, 3}, {rows});  // repeats add up
        auto loss = [&] {
            Tensor out = zeros({rows, c});
            embedding_forward(out, ids, table);
            return dot(out, r);
        };
        Tensor dt = zeros({v, c});
        embedding_backward(dt, r, ids);
        expect_grad("dtable", table, dt, loss);
    });
}

TEST(Backward, CrossEntropy) {
    on_each_backend([] {
        const int64_t rows = 4, v = 11;
        const Tensor z = randn({rows, v}, 1, 3.0), targets = Tensor::from(std::vector<int32_t>{0, 10, 4, 4}, {rows});
        const float dloss = 0.75f;
        Tensor probs = zeros({rows, v});
        auto loss = [&] {
            Tensor losses = zeros({rows});
            crossentropy_forward(losses, probs, z, targets);
            double s = 0;
            for (int64_t i = 0; i < rows; ++i) s += losses.data<double>()[i];
            return double(dloss) * s;
        };
        loss();
        Tensor dz = zeros({rows, v});
        crossentropy_backward(dz, probs, targets, dloss);
        expect_grad("dlogits", z, dz, loss);
    });
}

}  // namespace
}  // namespace fp8kit
