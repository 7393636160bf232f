// tools/advise.cpp: `fp8kit advise (--shapes MxNxK,... | --model FILE) --out POLICY [--tokens M]
// [--recipe R] [--input-dtype f32|bf16] [--min-speedup X] [--budget S]` - per linear layer (M tokens,
// N outputs, K inputs), on this machine: the FP8 GEMM with the cast of A fused in (fp8kit::gemm
// on f32 or bf16 A and the recipe, the weight quantized and packed once, outside the timing; with
// --recipe weight_only the weight per row and A not quantized, GemmA(x), as quantize_'s) timed
// against the float32 baseline the GEMM benchmark uses, OpenBLAS's cblas_sgemm on the same thread
// count (bench::openblas_sgemm); the FP8 result's SQNR on sample activations - N(0,1) A
// (bench::normal_tensor), with N(0,1) weights for --shapes or the model's own weights - against
// the float64 product of the unquantized inputs; and the policy (docs/CHECKPOINTS.md): per layer
// fp8 yes/no, the recipe and why, which `fp8kit quantize --policy` reads. A layer runs in FP8 when
// it is at least --min-speedup times as fast and its SQNR meets the NUMERICS.md GEMM floor (25 dB).
// Timings are the best of repeated runs (bench::best_seconds, about --budget seconds each).
// Checked by tests/e2e/test_checkpoint.sh (the policy's format and decisions with --min-speedup
// 0 and 1e9, quantize honouring it) - never its timings.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint_commands.hpp"
#include "commands.hpp"
#include "numbers.hpp"
#include "bench/common.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "fp8kit/gemm.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::tools {

namespace {

struct AdviseArgs {
    std::string shapes, model, recipe = "block", input_dtype = "f32", out;
    bool force = false, json = false, shapes_given = false;
    int64_t tokens = 256;
    double budget = 0.2;       // seconds of timing per measurement
    double min_speedup = 1.0;  // FP8 must be at least this much faster than f32
};

constexpr double sqnr_floor = 25.0;  // docs/NUMERICS.md: FP8 GEMM vs the float64 product
constexpr int64_t sample_rows = 8;   // rows of D compared with the float64 product

struct Layer {
    std::string name;  // empty for --shapes
    int64_t m, n, k;
    Tensor weight;  // [n, k] f32
};

// What one layer's GEMM allocates (A [M, K], W [N, K], D [M, N], as f32) stays within 2^31
// elements each; else fp8kit::Error naming `what` (the shape, or --tokens and the weight).
void check_gemm_size(int64_t m, int64_t n, int64_t k, const std::string& what) {
    constexpr int64_t limit = int64_t(1) << 31;
    const auto over = [&](int64_t a, int64_t b) { return a > limit / b; };  // a * b > 2^31, without overflow
    if (over(m, n) || over(n, k) || over(m, k)) throw Error(what + " needs M*N, N*K, M*K <= 2^31");
}

std::vector<Layer> parse_shapes(const std::string& text) {
    // M x N x K items separated by commas; each number through the command's one parser.
    std::vector<Layer> layers;
    for (size_t at = 0;;) {
        const size_t comma = text.find(',', at);
        const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        const size_t x1 = item.find('x'), x2 = x1 == std::string::npos ? x1 : item.find('x', x1 + 1);
        if (x2 == std::string::npos || item.find('x', x2 + 1) != std::string::npos)
            throw Error("--shapes: " + quote_printable(item) + " is not MxNxK (e.g. 16x4096x4096)");
        const int64_t m = parse_integer("--shapes M", item.substr(0, x1), 1, int64_t(1) << 31);
        const int64_t n = parse_integer("--shapes N", item.substr(x1 + 1, x2 - x1 - 1), 1, int64_t(1) << 31);
        const int64_t k = parse_integer("--shapes K", item.substr(x2 + 1), 1, int64_t(1) << 31);
        check_gemm_size(m, n, k, "--shapes: " + quote_printable(item));
        layers.push_back({"", m, n, k, Tensor()});
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return layers;
}

// The 2-D floating weights quantize would convert by default (the same skip rule), without their
// values yet (model_weights fills them once every size is checked).
std::vector<Layer> model_layers(const Checkpoint& c, int64_t tokens) {
    const SkipRule skip;
    std::vector<Layer> layers;
    for (const std::string& name : c.names()) {
        const SafetensorsEntry& e = c.entry(name);
        if (e.shape.size() != 2 || !is_float_weight(e.dtype) || skip.skips(name)) continue;
        layers.push_back({name, tokens, e.shape[0], e.shape[1], Tensor()});
    }
    if (layers.empty()) throw Error(c.path() + ": no 2-D floating weights to advise on");
    return layers;
}

// SQNR of D's first rows against the float64 product of the values of A and W (both f32 here).
double gemm_sqnr(const Tensor& a, const Tensor& w, const Tensor& d) {
    const int64_t rows = std::min(sample_rows, a.size(0)), n = w.size(0), k = w.size(1);
    const float* pa = a.data<const float>();
    const float* pw = w.data<const float>();
    std::vector<double> ref(size_t(rows * n));
    for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) s += double(pa[i * k + p]) * double(pw[j * k + p]);
            ref[size_t(i * n + j)] = s;
        }
    }
    return compare(ref.data(), d.data<float>(), rows * n).sqnr_db;
}

void run_advise(const AdviseArgs& a) {
    if (a.shapes_given == !a.model.empty()) throw Error("advise needs exactly one of --shapes and --model");
    if (a.recipe == "delayed") throw Error("--recipe delayed needs training state; use tensorwise, rowwise, block, mxfp8 or weight_only");
    // The policy's recipe decides what is timed: its scheme quantizes the weight (weight_only: per
    // row, as rowwise), quantize_input whether A is cast (weight_only: not, GemmA(x)).
    PolicyLayer as_recorded;
    try {
        as_recorded.set_recipe(a.recipe);
    } catch (const Error& e) {
        throw Error(std::string("--recipe: ") + e.what());
    }
    const bool weight_only = !as_recorded.quantize_input;
    const Recipe recipe = parse_recipe(recipe_of(*as_recorded.scheme));
    if (a.input_dtype != "f32" && a.input_dtype != "bf16") throw Error("--input-dtype " + a.input_dtype + ": expected f32 or bf16");
    const DType input_dtype = a.input_dtype == "f32" ? DType::f32 : DType::bf16;
    std::vector<Layer> layers;
    std::unique_ptr<Checkpoint> model;
    if (a.model.empty()) {
        layers = parse_shapes(a.shapes);
    } else {
        reading_inputs([&] {
            model = std::make_unique<Checkpoint>(a.model);
            layers = model_layers(*model, a.tokens);
        });
        for (const Layer& l : layers) check_gemm_size(l.m, l.n, l.k, "--tokens " + std::to_string(a.tokens) + " with " + quote_printable(l.name) + " " + to_string(Shape{l.n, l.k}));
    }
    check_output(a.out, false, model ? model->files() : std::vector<std::string>{}, a.force);
    // The weights: N(0,1) for --shapes, the model's own values for --model.
    reading_inputs([&] {
        for (size_t i = 0; i < layers.size(); ++i) {
            Layer& l = layers[i];
            l.weight = model ? to_f32(model->tensor(l.name)).contiguous() : bench::normal_tensor(l.n, l.k, DType::f32, uint32_t(i + 1));
        }
    });
    const int threads = num_threads();
    {
        float probe = 0;
        const float one = 1;
        if (!bench::openblas_sgemm(&one, &one, &probe, 1, 1, 1, threads)) {
            throw Error("advise times FP8 against OpenBLAS sgemm, and this build has no OpenBLAS (scripts/setup.sh installs it)");
        }
    }
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    if (!a.json) std::printf("baseline: OpenBLAS cblas_sgemm, float32, %d thread(s); FP8: fp8kit::gemm, recipe %s, %s A %s, "
                "W quantized and packed once; SQNR vs the float64 product on %lld rows of N(0,1) activations\n",
                threads, a.recipe.c_str(), a.input_dtype.c_str(), weight_only ? "not quantized" : "cast fused",
                static_cast<long long>(sample_rows));
    if (!a.json) std::printf("%-40s %-18s %11s %11s %8s %9s  %s\n", "layer", "MxNxK", "f32 ms", "fp8 ms", "speedup", "SQNR dB", "fp8");
    Policy policy;
    for (size_t i = 0; i < layers.size(); ++i) {
        const Layer& l = layers[i];
        // A as given to the FP8 GEMM (f32 or bf16) and its exact values in f32 for the baseline.
        const Tensor x = bench::normal_tensor(l.m, l.k, input_dtype, uint32_t(1000 + i));
        const Tensor x32 = to_f32(x);
        Tensor d32 = Tensor::empty({l.m, l.n}, DType::f32);
        const double t32 = bench::best_seconds(
            [&] { bench::openblas_sgemm(x32.data<float>(), l.weight.data<const float>(), d32.data<float>(), l.m, l.n, l.k, threads); },
            a.budget);
        const PackedWeight w(quantize(l.weight, recipe.options(Role::weight)));
        const QuantizeOptions qa = recipe.options(Role::input);
        Tensor d8;
        const double t8 = bench::best_seconds([&] { d8 = gemm(weight_only ? GemmA(x) : GemmA(x, qa), w); }, a.budget);
        const double sqnr = gemm_sqnr(x32, l.weight, d8);
        const double speedup = t32 / t8;
        PolicyLayer pl;
        if (l.name.empty()) {
            pl.weight_shape = {l.n, l.k};
        } else {
            pl.name = l.name;
        }
        pl.fp8 = speedup >= a.min_speedup && sqnr >= sqnr_floor;
        if (pl.fp8) pl.set_recipe(a.recipe);
        char reason[200];
        std::snprintf(reason, sizeof reason, "%s: fp8 %.2fx f32 speed at M=%lld (need %.2fx), sqnr %.1f dB (floor %.0f)",
                      pl.fp8 ? "faster and accurate" : (sqnr < sqnr_floor ? "not accurate enough" : "not faster"), speedup,
                      static_cast<long long>(l.m), a.min_speedup, sqnr, sqnr_floor);
        pl.reason = reason;
        const std::string dims = std::to_string(l.m) + "x" + std::to_string(l.n) + "x" + std::to_string(l.k);
        rows.push_back({{"layer", l.name.empty() ? dims : l.name}, {"m", l.m}, {"n", l.n}, {"k", l.k}, {"f32_ms", t32 * 1e3},
                        {"fp8_ms", t8 * 1e3}, {"speedup", speedup}, {"sqnr_db", sqnr}, {"fp8", pl.fp8}});
        if (!a.json) std::printf("%-40s %-18s %11.3f %11.3f %8.2f %9.2f  %s\n", printable(l.name.empty() ? dims : l.name).substr(0, 40).c_str(),
                    dims.c_str(), t32 * 1e3, t8 * 1e3, speedup, sqnr, pl.fp8 ? "yes" : "no");
        policy.layers.push_back(std::move(pl));
    }
    writing_output([&] { write_policy(a.out, policy); });
    if (a.json) std::printf("%s\n", nlohmann::ordered_json{{"policy", a.out}, {"layers", std::move(rows)}}.dump().c_str());
    else std::printf("policy written to %s (fp8kit quantize IN OUT --policy %s)\n", a.out.c_str(), a.out.c_str());
}

}  // namespace

void add_advise_command(CLI::App& app) {
    auto a = std::make_shared<AdviseArgs>();
    CLI::App* c = app.add_subcommand("advise", "time FP8 against f32 per linear layer on this machine and write a policy");
    c->add_option("--shapes", a->shapes, "linear layers as MxNxK (tokens x outputs x inputs), comma-separated")
        ->each([a](const std::string&) { a->shapes_given = true; });
    c->add_option("--model", a->model, "a safetensors checkpoint (file or shard directory): each 2-D weight [N, K], M = --tokens")
        ->check(not_empty);
    c->add_option("--out", a->out, "where to write the policy JSON")->required()->check(not_empty);
    add_integer(c, "--tokens", a->tokens, 1, int64_t(1) << 31, "M for --model");
    c->add_option("--recipe", a->recipe, "tensorwise, rowwise, block, mxfp8 or weight_only (the weight per row, the activations not quantized)")
        ->capture_default_str();
    c->add_option("--input-dtype", a->input_dtype, "activations given to the FP8 GEMM: f32 or bf16")->capture_default_str();
    add_real(c, "--min-speedup", a->min_speedup, 0, 1e12, "FP8 only where at least this much faster than f32");
    add_real(c, "--budget", a->budget, 1e-6, 3600, "seconds of timing per measurement");
    c->add_flag("--force", a->force, "replace --out if it exists");
    c->add_flag("--json", a->json, "print one JSON object (the measurements per layer) instead of the table");
    c->footer(std::string("Examples:\n  fp8kit advise --shapes 16x4096x4096,256x4096x4096 --out policy.json\n"
                          "  fp8kit advise --model model/ --tokens 256 --out policy.json --json\n") + exit_codes_help);
    c->callback([a] { run_advise(*a); });
}

}  // namespace fp8kit::tools
