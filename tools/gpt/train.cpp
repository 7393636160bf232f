// tools/gpt/train.cpp: the training loop of `fp8kit train` - data windows from a byte corpus (the
// built-in one: tools/gpt/corpus.txt), a recipe applied to a fresh GPT, AdamW with warmup +
// cosine decay, held-out loss - and sampling.
// Checked by tests/nn/test_train.cpp (two runs with one seed agree bit for bit, a policy's
// per-layer report, bad input), tests/nn/test_train_e2e.cpp (every FP8 recipe within 1% of f32
// over several seeds, loss falls) and tests/e2e/test_cli.sh (the command).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <random>
#include <sstream>

#include "gpt/gpt.hpp"

namespace fp8kit::gpt {

using nn::AdamW;
using nn::AdamWOptions;
using nn::ConversionReport;
using nn::Float8Linear;
using nn::Float8LinearOptions;
using nn::Linear;
using nn::LinearFilter;

extern const unsigned char corpus_bytes[];
extern const size_t corpus_size;

std::string_view builtin_corpus() { return {reinterpret_cast<const char*>(corpus_bytes), corpus_size}; }

const std::vector<std::string>& training_recipes() {
    static const std::vector<std::string> r{"f32", "bf16", "tensorwise", "rowwise", "block", "delayed"};
    return r;
}

void TrainConfig::validate() const {
    model.validate();
    if (batch < 1 || steps < 1 || eval_batches < 1 || !(lr > 0 && lr < 1))
        throw Error("fp8kit::gpt::TrainConfig: batch, steps and eval_batches must be >= 1 and lr in (0, 1)");
    if (model.vocab < 256) throw Error("fp8kit::gpt::TrainConfig: byte tokens need vocab >= 256, got " + std::to_string(model.vocab));
    check_fits_memory(memory_bytes(), "fp8kit::gpt::TrainConfig: training a GPT of " + std::to_string(model.layers) + " layers, width " +
                                          std::to_string(model.width) + " on batches of " + std::to_string(batch));
}

double TrainConfig::memory_bytes() const {
    const double tokens = double(batch) * double(model.context);
    return 4 * model.parameter_bytes() + 4 * tokens * (double(model.vocab) + 4 * double(model.layers) * double(model.width));
}

namespace {

// B windows of T + 1 bytes starting at `starts`: tokens = bytes [s, s + T), targets shifted by one.
void fill_batch(std::string_view text, const std::vector<int64_t>& starts, int64_t t, Tensor& tokens, Tensor& targets) {
    int32_t* x = tokens.data<int32_t>();
    int32_t* y = targets.data<int32_t>();
    for (size_t b = 0; b < starts.size(); ++b)
        for (int64_t i = 0; i < t; ++i) {
            x[int64_t(b) * t + i] = int32_t(static_cast<unsigned char>(text[size_t(starts[b] + i)]));
            y[int64_t(b) * t + i] = int32_t(static_cast<unsigned char>(text[size_t(starts[b] + i + 1)]));
        }
}

float learning_rate(const TrainConfig& c, int64_t step) {
    const int64_t warmup = std::max<int64_t>(1, c.steps / 10);
    if (step < warmup) return c.lr * float(step + 1) / float(warmup);
    const double progress = double(step - warmup) / double(std::max<int64_t>(1, c.steps - warmup));
    return float(double(c.lr) * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi * progress))));
}

// Per Linear (in model order): FP8 and with which recipe, or float32, and why - the policy entry's
// reason, or for layers without an entry the run's recipe or the filter's reason.
std::string policy_report(GPT& model, const Policy& policy, const ConversionReport& rep) {
    std::ostringstream s;
    s << "  " << rep.converted.size() << " Linear layer(s) in FP8, " << rep.skipped.size() << " in float32";
    for (auto& [name, m] : model.named_modules()) {
        const auto* l = dynamic_cast<const Linear*>(m);
        if (!l) continue;
        const auto* f = dynamic_cast<const Float8Linear*>(l);
        const PolicyLayer* e = policy.find(name + ".weight", {l->out_features(), l->in_features()});
        s << "\n  " << name << ": " << (f ? "FP8 " + std::string(to_string(f->options().recipe.kind)) : std::string("float32")) << " - ";
        if (e) {
            s << "policy: " << (e->reason.empty() ? std::string(e->fp8 ? "fp8" : "not fp8") : e->reason);
        } else if (f) {
            s << "no policy entry: the run's recipe";
        } else {
            for (const auto& [n, why] : rep.skipped)
                if (n == name) s << "no policy entry: " << why;
        }
    }
    return s.str();
}

void apply_recipe(GPT& model, const std::string& recipe, const std::optional<Policy>& policy, TrainResult& r) {
    if (recipe == "f32") return;
    if (recipe == "bf16") {
        for (auto& [name, m] : model.named_modules())
            if (auto* l = dynamic_cast<Linear*>(m)) l->precision = nn::MatmulPrecision::bf16;
        return;
    }
    Float8LinearOptions o;
    o.recipe = parse_recipe(recipe);  // fp8kit::Error for an unknown name
    const LinearFilter base = nn::default_filter();
    const LinearFilter filter = [&](const Linear& l, const std::string& name, std::string& why) {
        if (name == "lm_head") {
            why = "the output layer stays in high precision";
            return false;
        }
        return base(l, name, why);
    };
    // A policy decides for the layers it has entries for (FP8 or not, and the recipe); the
    // others follow the filter with this run's recipe.
    const ConversionReport rep = policy ? nn::convert_to_float8_training(model, nn::policy_plan(*policy, o, filter))
                                        : nn::convert_to_float8_training(model, filter, o);
    r.conversion = policy ? policy_report(model, *policy, rep) : rep.text();
}

}  // namespace

void check_training_text(std::string_view text, const TrainConfig& c) {
    const int64_t t = c.model.context, split = int64_t(text.size()) * 9 / 10;
    if (split - t - 1 < 1 || int64_t(text.size()) - split - t - 1 < 1)
        throw Error("the training text has " + std::to_string(text.size()) + " bytes; it needs more than " +
                    std::to_string(10 * (t + 2)) + " for context " + std::to_string(t));
}

TrainResult train_gpt(std::string_view text, const TrainConfig& c, const std::string& recipe,
                      const std::function<void(int64_t, float)>& progress) {
    c.validate();
    check_training_text(text, c);
    const int64_t t = c.model.context;
    const int64_t split = int64_t(text.size()) * 9 / 10;
    const bool known = std::find(training_recipes().begin(), training_recipes().end(), recipe) != training_recipes().end() ||
                       recipe == "mxfp8";
    if (!known) throw Error("fp8kit::gpt::train_gpt: unknown recipe '" + recipe + "' (f32, bf16, tensorwise, rowwise, block, delayed, mxfp8)");
    if (recipe == "bf16" && c.device != Device::cpu)
        throw Error("fp8kit::gpt::train_gpt: the bf16 recipe emulates bf16 GEMM inputs on the host only, not on " +
                    std::string(to_string(c.device)));
    TrainResult r;
    r.recipe = recipe;
    r.model = std::make_unique<GPT>(c.model, c.seed);
    GPT& model = *r.model;
    apply_recipe(model, recipe, c.policy, r);
    model.to(c.device);
    AdamW opt(model.named_parameters(), AdamWOptions{c.lr, 0.9f, 0.95f, 1e-8f, 0.1f});
    std::mt19937_64 data_rng(c.seed ^ 0x9e3779b97f4a7c15ull);  // the data order: the same for every recipe
    Tensor tokens = Tensor::empty({c.batch, t}, DType::i32), targets = Tensor::empty({c.batch, t}, DType::i32);
    std::vector<int64_t> starts(static_cast<size_t>(c.batch));
    // tokens/s is timed after the warm-up steps (first-touch allocations, delayed scaling's first
    // amax, packing), the same count for every recipe.
    const int64_t warmup = c.steps >= 2 ? std::max<int64_t>(1, c.steps / 20) : 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto timed_from = t0;
    for (int64_t step = 0; step < c.steps; ++step) {
        if (step == warmup) timed_from = std::chrono::steady_clock::now();
        for (auto& s : starts) s = int64_t(data_rng() % uint64_t(split - t - 1));
        fill_batch(text, starts, t, tokens, targets);
        model.zero_grad();
        const float loss = model.loss(tokens.to(c.device), targets.to(c.device));
        if (step == 0) r.activation_bytes = model.activation_bytes();
        model.backward();
        opt.step(learning_rate(c, step));
        for (auto& [name, m] : model.named_modules()) m->on_step();
        r.losses.push_back(loss);
        if (progress) progress(step, loss);
    }
    const auto t1 = std::chrono::steady_clock::now();
    r.seconds = std::chrono::duration<double>(t1 - t0).count();
    r.tokens_per_second = double((c.steps - warmup) * c.batch * t) / std::chrono::duration<double>(t1 - timed_from).count();
    r.weight_bytes = 2 * model.weight_bytes() + opt.state_bytes();
    // Held-out loss: eval_batches x batch windows evenly spread over the last 10% of the text.
    const int64_t windows = c.eval_batches * c.batch, span = int64_t(text.size()) - split - t - 1;
    double sum = 0.0;
    for (int64_t e = 0; e < c.eval_batches; ++e) {
        for (int64_t b = 0; b < c.batch; ++b) starts[size_t(b)] = split + (e * c.batch + b) * span / windows;
        fill_batch(text, starts, t, tokens, targets);
        sum += double(model.loss(tokens.to(c.device), targets.to(c.device)));
    }
    r.final_loss = float(sum / double(c.eval_batches));
    model.to(Device::cpu);
    return r;
}

std::string generate(GPT& model, const std::string& prompt, int64_t tokens, uint64_t seed,
                     const std::function<void(char)>& on_byte) {
    if (tokens < 0) throw Error("fp8kit::gpt::generate: tokens must be >= 0, got " + std::to_string(tokens));
    const int64_t ctx = model.config().context, v = model.config().vocab;
    std::vector<int32_t> seq;
    for (unsigned char ch : prompt) seq.push_back(int32_t(ch));
    if (seq.empty()) seq.push_back(int32_t('\n'));
    std::mt19937_64 rng(seed);
    std::string out;
    for (int64_t i = 0; i < tokens; ++i) {
        const int64_t n = std::min<int64_t>(int64_t(seq.size()), ctx);
        const std::vector<int32_t> window(seq.end() - n, seq.end());
        const Tensor logits = model.forward(Tensor::from(window, {1, n}).to(model.device())).to(Device::cpu);
        const float* z = logits.data<float>() + (n - 1) * v;
        // softmax(z / 0.8), sampled by inverting the cumulative sum
        double maxv = z[0];
        for (int64_t j = 1; j < v; ++j) maxv = std::max(maxv, double(z[j]));
        std::vector<double> p(static_cast<size_t>(v));
        double sum = 0.0;
        for (int64_t j = 0; j < v; ++j) sum += (p[size_t(j)] = std::exp((double(z[j]) - maxv) / 0.8));
        double u = double(rng() >> 11) * 0x1p-53 * sum;
        int64_t pick = v - 1;
        for (int64_t j = 0; j < v; ++j) {
            if (u < p[size_t(j)]) {
                pick = j;
                break;
            }
            u -= p[size_t(j)];
        }
        seq.push_back(int32_t(pick));
        out.push_back(char(static_cast<unsigned char>(pick)));
        if (on_byte) on_byte(out.back());
    }
    return out;
}

}  // namespace fp8kit::gpt
