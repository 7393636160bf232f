// tests/ops/test_layernorm.cpp: LayerNorm and RMSNorm forward/backward of the cpu backend against
// the reference backend, on rows x channels grids with 1, primes and a size that runs on several
// threads, within the bounds of docs/NUMERICS.md ("Layer ops"), u = 2^-24:
//   mean, rstd, dinp (float64, rounded once by both):  2u |ref| + 2^-50 * magnitude
//   out  = fl(fl(fl(norm) w) + b) against one rounding:  2u |out| + 3u |norm w|
//   dweight, dbias (float32 sums over the rows):  (gamma_{rows+3} + u) (|initial| + sum |terms|)
// A wrong eps (1e-6 for 1e-5) and a dropped row are shown to exceed them; results do not depend
// on the thread count; errors name the argument. The cuda backend is held to the same bounds
// (CudaMatchesRefWithinTheBound; skipped, saying why, without a GPU).
#include "ops/layer_bound.hpp"

namespace fp8kit {
namespace {

using test::gamma;
using test::u32;

struct NormOut {
    Tensor out, mean, rstd, dx, dw, db;
};

// Forward then backward on backend b; the backward from the saved statistics of `saved` (the
// reference's, so that both backends' backward passes see the same inputs), else its own.
// eps and dout are parameters so that a test can plant an error.
NormOut run_norm(Backend b, bool layer, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& dout,
                 const Tensor& dw0, const Tensor& db0, const NormOut* saved = nullptr, double eps = 1e-5) {
    return test::on_backend(b, [&] {
        const int64_t rows = x.size(0);
        const Device d = test::device_of(b);
        const Tensor xb = test::moved(x, b), wb = test::moved(w, b), g = test::moved(dout, b);
        NormOut o{Tensor::empty(x.shape(), DType::f32, d), Tensor::empty({rows}, DType::f32, d),
                  Tensor::empty({rows}, DType::f32, d),  Tensor::empty(x.shape(), DType::f32, d),
                  test::moved(dw0, b).clone(),           test::moved(db0, b).clone()};
        const Tensor mean = saved ? test::moved(saved->mean, b) : o.mean, rstd = saved ? test::moved(saved->rstd, b) : o.rstd;
        if (layer) {
            layernorm_forward(o.out, o.mean, o.rstd, xb, wb, test::moved(bias, b), eps);
            layernorm_backward(o.dx, o.dw, o.db, g, xb, wb, mean, rstd);
        } else {
            rmsnorm_forward(o.out, o.rstd, xb, wb, eps);
            rmsnorm_backward(o.dx, o.dw, g, xb, wb, rstd);
        }
        return NormOut{test::host(o.out), test::host(o.mean), test::host(o.rstd),
                       test::host(o.dx),  test::host(o.dw),   test::host(o.db)};
    });
}

struct Bounds {
    std::vector<double> out, mean, rstd, dx, dw, db;
};

Bounds norm_bounds(bool layer, const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dw0,
                   const Tensor& db0, const NormOut& ref) {
    const int64_t rows = x.size(0), c = x.size(1);
    Bounds bd;
    bd.out.resize(size_t(rows * c));
    bd.dx.resize(size_t(rows * c));
    bd.mean.resize(size_t(rows));
    bd.rstd.resize(size_t(rows));
    std::vector<double> mw(static_cast<size_t>(c)), mb(static_cast<size_t>(c));
    for (int64_t i = 0; i < c; ++i) {
        mw[size_t(i)] = std::abs(dw0.get({i}));
        mb[size_t(i)] = layer ? std::abs(db0.get({i})) : 0.0;
    }
    for (int64_t r = 0; r < rows; ++r) {
        const double m = layer ? ref.mean.get({r}) : 0.0, rs = ref.rstd.get({r});
        double sum_abs = 0, mean_gw = 0, mean_gwn = 0;
        for (int64_t i = 0; i < c; ++i) {
            const double n = (x.get({r, i}) - m) * rs, gw = dout.get({r, i}) * w.get({i});
            sum_abs += std::abs(x.get({r, i}));
            mean_gw += std::abs(gw) / double(c);
            mean_gwn += std::abs(gw * n) / double(c);
        }
        bd.mean[size_t(r)] = 2 * u32 * std::abs(m) + 0x1p-50 * sum_abs / double(c);
        bd.rstd[size_t(r)] = 2 * u32 * rs;
        for (int64_t i = 0; i < c; ++i) {
            const double n = (x.get({r, i}) - m) * rs, g = dout.get({r, i});
            const double o = ref.out.get({r, i});
            bd.out[size_t(r * c + i)] = (2 * u32 * std::abs(o) + 3 * u32 * std::abs(n * w.get({i}))) * (1 + 0x1p-20);
            const double dx_mag = rs * (std::abs(g * w.get({i})) + mean_gw + std::abs(n) * mean_gwn);
            bd.dx[size_t(r * c + i)] = 2 * u32 * std::abs(ref.dx.get({r, i})) + 0x1p-50 * dx_mag * double(c);
            mw[size_t(i)] += std::abs(g * n);
            mb[size_t(i)] += std::abs(g);
        }
    }
    for (int64_t i = 0; i < c; ++i) {
        bd.dw.push_back((gamma(rows + 3) + u32) * mw[size_t(i)] * (1 + 0x1p-20));
        bd.db.push_back((gamma(rows) + u32) * mb[size_t(i)]);
    }
    return bd;
}

void expect_norm_within(bool layer, const NormOut& cpu, const NormOut& ref, const Bounds& bd) {
    test::expect_within("out", cpu.out, ref.out, bd.out);
    if (layer) test::expect_within("mean", cpu.mean, ref.mean, bd.mean);
    test::expect_within("rstd", cpu.rstd, ref.rstd, bd.rstd);
    test::expect_within("dinp", cpu.dx, ref.dx, bd.dx);
    test::expect_within("dweight", cpu.dw, ref.dw, bd.dw);
    if (layer) test::expect_within("dbias", cpu.db, ref.db, bd.db);
}

// rows x c inputs - rows with an offset (the mean matters) and different scales - with the
// reference's results and the bounds; run() on another backend from the reference's mean and rstd.
struct NormCase {
    bool layer;
    Tensor x, w, b, g, dw0, db0;
    NormOut ref;
    Bounds bounds;
    NormCase(bool layer_norm, int64_t rows, int64_t c)
        : layer(layer_norm), x(test::randn({rows, c}, 1, 2.0)), w(test::randn({c}, 2)), b(test::randn({c}, 3)),
          g(test::randn({rows, c}, 4)), dw0(test::randn({c}, 5)), db0(test::randn({c}, 6)) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < c; ++i) x.set({r, i}, x.get({r, i}) * float(1 + r % 5) + float(r % 3));
        ref = run_norm(Backend::ref, layer, x, w, b, g, dw0, db0);
        bounds = norm_bounds(layer, x, w, g, dw0, db0, ref);
    }
    NormOut run(Backend be) const { return run_norm(be, layer, x, w, b, g, dw0, db0, &ref); }
};

TEST(LayerNormOps, CpuMatchesRefWithinTheBound) {
    const int64_t shapes[][2] = {{1, 1}, {1, 7}, {3, 1}, {5, 17}, {13, 64}, {31, 129}, {600, 520}};
    for (bool layer : {true, false}) {
        for (const auto& s : shapes) {
            SCOPED_TRACE(::testing::Message() << (layer ? "layernorm " : "rmsnorm ") << s[0] << "x" << s[1]);
            const NormCase n(layer, s[0], s[1]);
            NormOut first;
            test::for_thread_counts([&](int) {
                const NormOut cpu = n.run(Backend::cpu);
                expect_norm_within(layer, cpu, n.ref, n.bounds);
                if (!first.out.defined()) {
                    first = cpu;
                    return;
                }
                test::expect_same("out, threads", cpu.out, first.out);
                test::expect_same("dinp, threads", cpu.dx, first.dx);
                test::expect_same("dweight, threads", cpu.dw, first.dw);
            });
        }
    }
}

// The cuda backend (one block a row; the parameter gradients one thread a column) on the same
// inputs and bounds.
TEST(LayerNormOps, CudaMatchesRefWithinTheBound) {
    FP8KIT_SKIP_WITHOUT_CUDA();
    const int64_t shapes[][2] = {{1, 1}, {1, 7}, {3, 1}, {5, 17}, {13, 64}, {31, 129}, {600, 520}, {4, 3000}};
    for (bool layer : {true, false}) {
        for (const auto& s : shapes) {
            SCOPED_TRACE(::testing::Message() << (layer ? "layernorm " : "rmsnorm ") << s[0] << "x" << s[1]);
            const NormCase n(layer, s[0], s[1]);
            expect_norm_within(layer, n.run(Backend::cuda), n.ref, n.bounds);
        }
    }
}

TEST(LayerNormOps, PlantedErrorsExceedTheBound) {
    for (bool layer : {true, false}) {
        SCOPED_TRACE(layer ? "layernorm" : "rmsnorm");
        const Tensor x = test::randn({9, 48}, 1, 0.5), w = test::randn({48}, 2), b = test::randn({48}, 3);
        const Tensor g = test::randn({9, 48}, 4), dw0 = test::randn({48}, 5), db0 = test::randn({48}, 6);
        const NormOut ref = run_norm(Backend::ref, layer, x, w, b, g, dw0, db0);
        const Bounds bd = norm_bounds(layer, x, w, g, dw0, db0, ref);
        // eps 1e-6 instead of 1e-5: rstd off by ~ 4.5e-6 / var relative, far above 2u.
        const NormOut wrong_eps = run_norm(Backend::cpu, layer, x, w, b, g, dw0, db0, &ref, 1e-6);
        test::expect_caught("eps 1e-6: rstd", wrong_eps.rstd, ref.rstd, bd.rstd);
        test::expect_caught("eps 1e-6: out", wrong_eps.out, ref.out, bd.out);
        // The last row's gradient dropped from dweight / dbias.
        Tensor g_dropped = g.clone();
        for (int64_t i = 0; i < 48; ++i) g_dropped.set({8, i}, 0.0f);
        const NormOut dropped = run_norm(Backend::cpu, layer, x, w, b, g_dropped, dw0, db0, &ref);
        test::expect_caught("dropped row: dweight", dropped.dw, ref.dw, bd.dw);
        if (layer) test::expect_caught("dropped row: dbias", dropped.db, ref.db, bd.db);
    }
}

TEST(LayerNormOps, ErrorsNameTheArgument) {
    const Tensor x = test::randn({4, 6}, 1), w = test::randn({6}, 2);
    Tensor out = Tensor::empty({4, 6}, DType::f32), mean = Tensor::empty({4}, DType::f32), rstd = Tensor::empty({4}, DType::f32);
    test::expect_error([&] { layernorm_forward(out, mean, rstd, x, test::randn({5}, 3), w); }, "weight is f32 [5], expected f32 [6]");
    test::expect_error([&] { layernorm_forward(out, Tensor::empty({3}, DType::f32), rstd, x, w, w); }, "mean is f32 [3], expected f32 [4]");
    test::expect_error([&] { layernorm_forward(out, mean, rstd, x, w, w, -1.0); }, "eps is -1");
    test::expect_error([&] { rmsnorm_forward(out, rstd, Tensor::zeros({4, 6}, DType::i32), w); }, "inp is i32 [4, 6], expected an f32 or f64");
    test::expect_error([&] { rmsnorm_forward(out.transpose(), rstd, x.transpose().contiguous(), test::randn({4}, 1)); }, "is not contiguous");
}

}  // namespace
}  // namespace fp8kit
