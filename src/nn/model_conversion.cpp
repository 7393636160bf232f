// src/nn/model_conversion.cpp: model conversion policies - convert_to_float8_training (swap Linear for
// Float8Linear where a filter allows; torchao's convert_to_float8_training) and
// enable_layerwise_casting (weights stored in FP8, upcast per layer; Diffusers'
// enable_layerwise_casting, with the same default skip patterns), each also driven by a policy
// file (fp8kit/checkpoint.hpp: per layer FP8 or not, and the recipe). Checked on a model with odd
// shapes in tests/nn/test_model_conversion.cpp (report, skip rules, policies, bytes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <regex>
#include <sstream>

#include "fp8kit/nn.hpp"

namespace fp8kit::nn {

namespace {

// Seconds for the best of 3 forward + backward passes of `layer` on x (dy = ones).
double time_linear(Linear& layer, const Tensor& x, const Tensor& dy) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        layer.forward(x);
        layer.backward(dy);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

// The break-even of this machine, measured: square Linear layers (d x d, 256 rows, the GPT's
// batch x context) forward + backward in float32 (src/nn's GEMM) and as a tensorwise
// Float8Linear (three FP8 GEMMs and their casts through fp8kit::gemm), d = 64 ... 1024; the
// threshold is the smallest d from which FP8 is faster at every larger d measured. torchao fixes
// its thresholds (K <= 4096, N <= 1024 skipped) from H100 measurements; on a CPU the balance is
// different (the FP8 GEMM is bf16 arithmetic on widened codes, the float32 GEMM is plain FMA),
// so it is measured here rather than copied.
AutoFilterThresholds measure_thresholds() {
    const int64_t rows = 256;
    std::vector<int64_t> dims{64, 128, 256, 512, 1024};
    std::vector<std::pair<double, double>> times;  // f32, fp8 per d
    for (int64_t d : dims) {
        Linear f32(d, d, false);
        float* w = f32.weight().value.data<float>();
        for (int64_t i = 0; i < d * d; ++i) w[i] = float((i * 7919) % 201 - 100) * 1e-3f;
        Float8Linear fp8(f32, Float8LinearOptions{});
        std::vector<float> xv(size_t(rows * d));
        for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int64_t(i * 104729) % 199 - 99) * 1e-2f;
        const Tensor x = Tensor::from(xv, {rows, d});
        const Tensor dy = Tensor::from(std::vector<float>(size_t(rows * d), 1e-3f), {rows, d});
        times.emplace_back(time_linear(f32, x, dy), time_linear(fp8, x, dy));
    }
    size_t from = dims.size();
    while (from > 0 && times[from - 1].second < times[from - 1].first) --from;
    std::ostringstream why;
    why << "measured on this machine (d x d Linear, " << rows << " rows, forward + backward, best of 3; f32 / fp8 ms):";
    for (size_t i = 0; i < dims.size(); ++i) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " %lld: %.2f / %.2f", (long long)dims[i], times[i].first * 1e3, times[i].second * 1e3);
        why << buf;
    }
    if (from == dims.size()) {
        why << "; FP8 was not faster at any size up to " << dims.back() << ", so nothing is converted";
        return {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(), why.str()};
    }
    why << "; FP8 is faster from " << dims[from] << " on";
    return {dims[from], dims[from], why.str()};
}

}  // namespace

AutoFilterThresholds auto_filter_thresholds() {
    static const AutoFilterThresholds t = measure_thresholds();  // once per process
    return t;
}

LinearFilter default_filter() {
    return [](const Linear& l, const std::string&, std::string& why) {
        if (l.in_features() % 16 != 0 || l.out_features() % 16 != 0) {
            why = "in " + std::to_string(l.in_features()) + " x out " + std::to_string(l.out_features()) +
                  ": not multiples of 16 (FP8 GEMM kernels tile by 16)";
            return false;
        }
        return true;
    };
}

LinearFilter auto_filter() {
    return [](const Linear& l, const std::string& name, std::string& why) {
        if (!default_filter()(l, name, why)) return false;
        const AutoFilterThresholds t = auto_filter_thresholds();
        if (l.in_features() < t.min_in || l.out_features() < t.min_out) {
            why = "in " + std::to_string(l.in_features()) + " x out " + std::to_string(l.out_features()) +
                  ": below the FP8 break-even (in >= " + std::to_string(t.min_in) + ", out >= " +
                  std::to_string(t.min_out) + ", " + t.reason + ")";
            return false;
        }
        return true;
    };
}

std::string ConversionReport::text() const {
    std::ostringstream s;
    s << "converted " << converted.size() << " Linear module(s) to Float8Linear";
    for (const auto& n : converted) s << "\n  + " << n;
    if (!skipped.empty()) s << "\nskipped " << skipped.size() << ":";
    for (const auto& [n, why] : skipped) s << "\n  - " << n << ": " << why;
    return s.str();
}

ConversionReport convert_to_float8_training(Module& model, const LinearFilter& filter, const Float8LinearOptions& opts) {
    opts.validate();
    return convert_to_float8_training(model, [&](const Linear& l, const std::string& name, std::string& why) {
        return !filter || filter(l, name, why) ? std::optional<Float8LinearOptions>(opts) : std::nullopt;
    });
}

ConversionReport convert_to_float8_training(Module& model, const LinearPlan& plan) {
    if (!plan) throw Error("fp8kit::nn::convert_to_float8_training: no plan");
    ConversionReport report;
    std::vector<std::pair<std::string, Linear*>> linears;
    for (auto& [name, m] : model.named_modules()) {
        if (auto* l = dynamic_cast<Linear*>(m); l && m->kind() == "Linear") linears.emplace_back(name, l);
        else if (m->kind() == "Float8Linear") report.skipped.emplace_back(name, "already Float8Linear");
    }
    for (auto& [name, l] : linears) {
        std::string why;
        if (name.empty()) throw Error("fp8kit::nn::convert_to_float8_training: the model itself is a Linear; wrap it in a module");
        if (l->weight().stored) {
            report.skipped.emplace_back(name, "weight stored in FP8 (layerwise casting or an FP8 checkpoint; inference only)");
        } else if (const std::optional<Float8LinearOptions> opts = plan(*l, name, why)) {
            opts->validate();
            model.replace(name, std::make_shared<Float8Linear>(*l, *opts));
            report.converted.push_back(name);
        } else {
            report.skipped.emplace_back(name, why.empty() ? "refused by the filter" : why);
        }
    }
    return report;
}

namespace {
// The policy's entry for a module's weight (Policy::find on "<module>.weight" and its shape).
const PolicyLayer* policy_entry(const Policy& policy, const std::string& module, const Shape& weight_shape) {
    return policy.find(module.empty() ? "weight" : module + ".weight", weight_shape);
}
std::string policy_reason(const PolicyLayer& e) { return "policy: " + (e.reason.empty() ? std::string("fp8 false") : e.reason); }
}  // namespace

LinearPlan policy_plan(const Policy& policy, const Float8LinearOptions& defaults, const LinearFilter& unmatched) {
    return [policy, defaults, unmatched](const Linear& l, const std::string& name, std::string& why) -> std::optional<Float8LinearOptions> {
        const PolicyLayer* e = policy_entry(policy, name, {l.out_features(), l.in_features()});
        if (!e) {
            if (unmatched && !unmatched(l, name, why)) return std::nullopt;
            return defaults;
        }
        if (!e->fp8) {
            why = policy_reason(*e);
            return std::nullopt;
        }
        if (!e->quantize_input) {
            throw Error("fp8kit::nn::policy_plan: the policy's entry for " + quote_printable(name) +
                        " is weight_only, an inference recipe (the input not quantized); training needs tensorwise, "
                        "rowwise, block or mxfp8");
        }
        Float8LinearOptions o = defaults;
        o.recipe = parse_recipe(recipe_of(*e->scheme));  // read_policy requires a recipe when fp8
        return o;
    };
}

bool computes_natively_in_fp8(std::string_view kind) {
    // fp8kit::gemm takes an FP8 weight directly on every backend; the others upcast.
    return kind == "Linear";
}

std::string LayerwiseCastingReport::text() const {
    std::ostringstream s;
    s << "layerwise casting: " << cast.size() << " module(s) upcast per forward, " << native.size()
      << " computing in FP8 directly, " << skipped.size() << " skipped";
    for (const auto& n : native) s << "\n  native " << n;
    for (const auto& n : cast) s << "\n  cast   " << n;
    for (const auto& [n, why] : skipped) s << "\n  skip   " << n << ": " << why;
    s << "\nweights: " << bytes_before << " bytes -> " << bytes_after << " bytes";
    return s.str();
}

LayerwiseCastingReport enable_layerwise_casting(Module& model, const LayerwiseCastingOptions& opts) {
    if (opts.storage != Format::e4m3fn && opts.storage != Format::e5m2 && opts.storage != Format::e4m3fnuz &&
        opts.storage != Format::e5m2fnuz)
        throw Error("fp8kit::nn::enable_layerwise_casting: storage must be an FP8 format (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), got " +
                    std::string(to_string(opts.storage)));
    if (opts.policy && !opts.scaled)
        throw Error("fp8kit::nn::enable_layerwise_casting: a policy's recipes need scaled storage (scaled = true)");
    std::vector<std::pair<std::string, std::regex>> patterns;
    for (const auto& p : opts.skip_patterns) {
        try {
            patterns.emplace_back(p, std::regex(p));
        } catch (const std::regex_error& e) {
            throw Error("fp8kit::nn::enable_layerwise_casting: skip pattern " + quote_printable(p) + " is not a regex: " + e.what());
        }
    }
    LayerwiseCastingReport report;
    for (const auto& [n, p] : model.named_parameters()) report.bytes_before += p->bytes();
    for (auto& [name, m] : model.named_modules()) {
        if (m->parameters().empty()) continue;
        const std::string kind(m->kind());
        std::string why;
        for (const auto& c : opts.skip_classes)
            if (c == kind) why = "class " + kind;
        for (const auto& [text, re] : patterns)
            if (why.empty() && std::regex_search(name, re)) why = "pattern " + quote_printable(text);
        // The policy's layout for the weight (its recipe's weight scaling), or tensor scaling; and
        // whether the entry lets a Linear cast its input (weight_only: not).
        std::optional<Scheme> weight_scheme;
        bool quantize_input = opts.quantize_input;
        if (why.empty() && opts.policy) {
            for (const auto& [pn, p] : m->parameters()) {
                if (pn != "weight" || !p->value.defined()) continue;
                if (const PolicyLayer* e = policy_entry(*opts.policy, name, p->value.shape())) {
                    if (!e->fp8) {
                        why = policy_reason(*e);
                    } else {
                        weight_scheme = e->scheme;
                        quantize_input = quantize_input && e->quantize_input;
                    }
                }
            }
        }
        if (!why.empty()) {
            report.skipped.emplace_back(name, why);
            continue;
        }
        for (const auto& [pn, p] : m->parameters()) {
            if (p->stored) continue;
            QuantizeOptions q;
            q.format = opts.storage;
            if (!opts.scaled) q.scale = Tensor::full({1}, 1.0f);  // unscaled: codes are the values themselves
            if (pn == "weight" && weight_scheme) q.scaling = scaling_of(*weight_scheme);
            p->stored = quantize(p->value, q);
            p->value = Tensor();
            p->grad = Tensor();
        }
        if (auto* l = dynamic_cast<Linear*>(m)) l->quantize_input = quantize_input;
        (computes_natively_in_fp8(kind) ? report.native : report.cast).push_back(name);
    }
    for (const auto& [n, p] : model.named_parameters()) report.bytes_after += p->bytes();
    return report;
}

}  // namespace fp8kit::nn
