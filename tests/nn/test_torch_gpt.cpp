// tests/nn/test_torch_gpt.cpp (label nn): the float32 GPT of the GPT app (tools/gpt/gpt.hpp)
// against PyTorch, the way llm.c checks itself: the same weights (a GPT(config, seed) of fp8kit,
// sent as they are), tokens and targets; tests/nn/torch_gpt_oracle.py runs the same network from
// torch operations on the CPU and returns logits, loss and every parameter's gradient. Each must
// agree to float32 rounding: for every tensor, max |fp8kit - torch| <= 1e-5 * max |torch| (about
// 100 float32 ulps of the tensor's largest entry: both sides sum up to a few hundred float32
// products, in different orders). Skipped (GTEST_SKIP, with the reason) when the venv's Python or
// its torch is missing.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "gpt/gpt.hpp"
#include "oracle.hpp"

namespace fp8kit::gpt {
namespace {

static_assert(std::endian::native == std::endian::little, "the oracle's files are little-endian");

template <class T>
void put(std::string& s, const T& v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// max |a - b| / max |b| over n floats
double relative_error(const float* a, const float* b, int64_t n) {
    double diff = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
        diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
        mag = std::max(mag, std::abs(double(b[i])));
    }
    return diff / mag;
}

TEST(TorchGPT, LogitsLossAndEveryGradientMatchPyTorch) {
    const GPTConfig cfg{2, 32, 4, 8, 256};
    const int64_t b = 2, t = 8;
    GPT model(cfg, 11);
    std::vector<int32_t> tokens(size_t(b * t)), targets(size_t(b * t));
    for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = int32_t((i * 37 + 5) % 256);
        targets[i] = int32_t((i * 101 + 17) % 256);
    }
    // Non-trivial norms and biases (GPT-2 initialises them to 1 and 0, which would hide a swap).
    for (auto& [name, p] : model.named_parameters())
        if (p->value.dim() == 1)
            for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] += 0.01f * float((i * 13) % 7 - 3);

    std::string req("FP8KGPT1");
    for (int64_t v : {cfg.layers, cfg.width, cfg.heads, cfg.context, cfg.vocab, b, t}) put(req, v);
    req.append(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size());
    req.append(reinterpret_cast<const char*>(targets.data()), 4 * targets.size());
    const auto params = model.named_parameters();
    put(req, uint32_t(params.size()));
    for (const auto& [name, p] : params) {
        put(req, uint32_t(name.size()));
        req.append(name);
        put(req, uint32_t(p->value.dim()));
        for (int64_t d : p->value.shape()) put(req, d);
        req.append(reinterpret_cast<const char*>(p->value.data<float>()), p->value.nbytes());
    }
    const std::string stem = test::unique_temp_stem("torch_gpt");
    const std::filesystem::path req_path = stem + ".req", resp_path = stem + ".resp";
    std::ofstream(req_path, std::ios::binary).write(req.data(), std::streamsize(req.size()));
    const test::OracleRun run = test::run_oracle(FP8KIT_PYTHON, FP8KIT_TORCH_GPT_ORACLE, {req_path.string(), resp_path.string()});
    const std::string resp = test::read_file(resp_path);
    for (const auto& f : {req_path, resp_path}) std::filesystem::remove(f);
    if (run.outcome == test::OracleRun::Outcome::skipped) GTEST_SKIP() << "PyTorch oracle unavailable: " << run.message;
    ASSERT_EQ(run.outcome, test::OracleRun::Outcome::passed) << run.message;

    const Tensor tok = Tensor::from(tokens, {b, t}), tgt = Tensor::from(targets, {b, t});
    model.zero_grad();
    const float loss = model.loss(tok, tgt);
    const Tensor logits = model.forward(tok);
    model.zero_grad();
    model.loss(tok, tgt);
    model.backward();

    size_t want = 8 + 4 * size_t(logits.numel()) + 4;
    for (const auto& [name, p] : params) want += p->grad.nbytes();
    ASSERT_EQ(resp.size(), want);
    const auto* f = reinterpret_cast<const float*>(resp.data() + 8);
    const double tol = 1e-5;
    EXPECT_LE(relative_error(logits.data<float>(), f, logits.numel()), tol) << "logits";
    f += logits.numel();
    EXPECT_LE(std::abs(double(loss) - double(*f)), tol * std::abs(double(*f))) << "loss " << loss << " torch " << *f;
    ++f;
    for (const auto& [name, p] : params) {
        const double e = relative_error(p->grad.data<float>(), f, p->grad.numel());
        EXPECT_LE(e, tol) << "grad of " << name;
        RecordProperty(name, std::to_string(e));
        f += p->grad.numel();
    }
}

}  // namespace
}  // namespace fp8kit::gpt
