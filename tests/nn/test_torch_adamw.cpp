// tests/nn/test_torch_adamw.cpp (label nn): fp8kit::nn::AdamW against torch.optim.AdamW (CPU,
// float32; tests/nn/torch_adamw_oracle.py): the same parameters (a matrix, decayed, and a vector,
// not decayed), the same gradients - magnitudes from 1e-7, near eps, to 10 - and a different
// learning rate at each of 6 steps, so weight decay, both bias corrections and the schedule all
// enter. After the last step every parameter must agree within the float32 rounding of the steps:
// |fp8kit - torch| <= S * 8 u (max |p| + 3 max lr), u = 2^-24 (per step a few roundings of the
// decayed weight and of an update of at most ~3 lr; the two sides order them differently). The
// oracle also returns two near misses - decay applied to every parameter, and Adam's coupled L2
// decay - and each must be outside that tolerance: it can tell them from AdamW.
// Skipped (GTEST_SKIP, with the reason) only when the venv's Python, numpy or torch is not installed.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "fp8kit/nn.hpp"
#include "oracle.hpp"

namespace fp8kit::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "the oracle's files are little-endian");

template <class T>
void put(std::string& s, const T& v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

TEST(TorchAdamW, SeveralStepsMatchTorchOptimAdamW) {
    const AdamWOptions opts{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    const std::vector<float> lrs{1e-3f, 4e-3f, 1e-2f, 7e-3f, 2e-3f, 5e-4f};
    const int64_t steps = int64_t(lrs.size());
    const std::vector<Shape> shapes{{8, 16}, {16}};
    std::mt19937_64 g(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> params;
    std::vector<std::vector<float>> grads;  // per parameter: steps x numel
    std::string req("FP8KADW1");
    for (float v : {opts.beta1, opts.beta2, opts.eps, opts.weight_decay}) put(req, v);
    put(req, steps);
    for (float lr : lrs) put(req, lr);
    put(req, uint32_t(shapes.size()));
    for (const Shape& shape : shapes) {
        auto p = std::make_shared<Parameter>();
        p->value = Tensor::zeros(shape, DType::f32);
        p->grad = Tensor::zeros(shape, DType::f32);
        const int64_t n = p->value.numel();
        for (int64_t i = 0; i < n; ++i) p->value.data<float>()[i] = 0.5f * nd(g);
        std::vector<float> gr(size_t(steps * n));
        // 10^-7 ... 10^1 by element: near eps, and far above it.
        for (size_t i = 0; i < gr.size(); ++i) gr[i] = nd(g) * std::pow(10.0f, float(int(i % 9) - 7));
        put(req, uint32_t(shape.size()));
        for (int64_t d : shape) put(req, d);
        req.append(reinterpret_cast<const char*>(p->value.data<float>()), size_t(n) * 4);
        req.append(reinterpret_cast<const char*>(gr.data()), gr.size() * 4);
        params.emplace_back(shape.size() == 2 ? "w" : "b", p);
        grads.push_back(std::move(gr));
    }
    const std::string stem = test::unique_temp_stem("torch_adamw");
    const std::filesystem::path req_path = stem + ".req", resp_path = stem + ".resp";
    std::ofstream(req_path, std::ios::binary).write(req.data(), std::streamsize(req.size()));
    const test::OracleRun run = test::run_oracle(FP8KIT_PYTHON, FP8KIT_TORCH_ADAMW_ORACLE, {req_path.string(), resp_path.string()});
    const std::string resp = test::read_file(resp_path);
    for (const auto& f : {req_path, resp_path}) std::filesystem::remove(f);
    if (run.outcome == test::OracleRun::Outcome::skipped) GTEST_SKIP() << "PyTorch oracle unavailable: " << run.message;
    ASSERT_EQ(run.outcome, test::OracleRun::Outcome::passed) << run.message;

    AdamW opt(params, opts);
    for (int64_t s = 0; s < steps; ++s) {
        for (size_t i = 0; i < params.size(); ++i) {
            Tensor& gt = params[i].second->grad;
            std::copy_n(grads[i].begin() + s * gt.numel(), gt.numel(), gt.data<float>());
        }
        opt.step(lrs[size_t(s)]);
    }
    int64_t total = 0;
    float max_p = 0;
    for (const auto& [name, p] : params) {
        total += p->value.numel();
        for (int64_t i = 0; i < p->value.numel(); ++i) max_p = std::max(max_p, std::abs(p->value.data<float>()[i]));
    }
    ASSERT_EQ(resp.size(), 8 + 3 * 4 * size_t(total));
    const double tol = double(steps) * 8 * 0x1p-24 * (double(max_p) + 3 * double(*std::max_element(lrs.begin(), lrs.end())));
    // Max |fp8kit - variant| over every parameter, variant 0 (AdamW), 1 (decay all), 2 (Adam L2).
    const auto diff = [&](int variant) {
        const auto* f = reinterpret_cast<const float*>(resp.data() + 8) + variant * total;
        double d = 0;
        for (const auto& [name, p] : params)
            for (int64_t i = 0; i < p->value.numel(); ++i) d = std::max(d, std::abs(double(p->value.data<float>()[i]) - double(*f++)));
        return d;
    };
    EXPECT_LE(diff(0), tol) << "against torch.optim.AdamW";
    EXPECT_GT(diff(1), tol) << "the tolerance cannot tell decaying the vector too";
    EXPECT_GT(diff(2), tol) << "the tolerance cannot tell Adam's coupled L2 decay";
    std::printf("max |fp8kit - torch|: AdamW %.3g, AdamW decaying all %.3g, Adam L2 %.3g (tolerance %.3g)\n", diff(0), diff(1), diff(2),
                tol);
}

}  // namespace
}  // namespace fp8kit::nn
