// tools/train.cpp: `fp8kit train` - the main job: trains the default small GPT of the GPT app
// (tools/gpt/gpt.hpp) on the built-in corpus (or --data FILE) once per recipe (f32, bf16, FP8
// tensorwise, rowwise, block, delayed) from the same initialisation and data order, with a
// progress bar on stderr; prints the table (held-out loss, gap to f32, tokens/s, memory), writes
// loss curves (CSV + SVG plot) and each trained model to --out; --policy applies a policy file
// (fp8kit advise) to the FP8 recipes; --device cuda trains on the GPU.
// `fp8kit generate` samples from a saved model (float32, or quantized by fp8kit quantize), each
// byte printed as it is sampled and the rate on stderr; `fp8kit bench generate` times models in turn.
// Every argument is checked before any work or output (an error naming the flag).
// Checked by tests/e2e/test_cli.sh (the table, files, generate, --policy's report, each refused
// argument leaving nothing behind).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "numbers.hpp"
#include "common.hpp"
#include "fp8kit/checkpoint.hpp"
#include "fp8kit/files.hpp"
#include "fp8kit/runtime.hpp"
#include "gpt/gpt.hpp"

namespace fp8kit::tools {
namespace {

struct TrainArgs {
    std::string data, recipe = "all", out = "fp8kit-train", policy, device = "cpu";
    // The defaults of gpt::TrainConfig; each must stay >= 1 (checked with the flag's name).
    int64_t steps = gpt::TrainConfig{}.steps, layers = gpt::GPTConfig{}.layers, width = gpt::GPTConfig{}.width,
            batch = gpt::TrainConfig{}.batch;
    // One thread by default: the default model's GEMMs are small (512 x 128 x 128), and on a
    // 2-core machine that is also busy with other work every parallel region waits for a
    // descheduled thread (measured on the project's shared VM: 200 FP8 steps took 344 s on two
    // threads against ~40 s on one). --threads N uses N.
    int threads = 1;
    uint64_t seed = 1;
};

// The largest values the numeric flags take: beyond them a run would not end in any useful time
// (the sizes are also checked against the machine's memory, gpt::check_fits_memory).
constexpr int64_t max_steps = 10'000'000, max_tokens = 1'000'000, max_rounds = 1000, max_batch = 1'000'000, max_threads = 1024;

bool is_fp8_recipe(const std::string& r) { return r != "f32" && r != "bf16"; }

// The recipes of --recipe: "all", or a comma list of known, distinct names (an error naming
// --recipe and the bad entry otherwise).
std::vector<std::string> parse_recipes(const std::string& list) {
    if (list == "all") return gpt::training_recipes();
    const auto known = [](const std::string& r) {
        const auto& all = gpt::training_recipes();
        return r == "mxfp8" || std::find(all.begin(), all.end(), r) != all.end();
    };
    std::vector<std::string> recipes;
    std::stringstream ss(list);
    for (std::string r; std::getline(ss, r, ',');) {
        if (r.empty()) throw Error("--recipe '" + list + "': an empty recipe name");
        if (!known(r)) throw Error("--recipe: unknown recipe '" + r + "' (all, or a comma list of f32, bf16, tensorwise, rowwise, block, delayed, mxfp8)");
        if (std::find(recipes.begin(), recipes.end(), r) != recipes.end()) throw Error("--recipe: '" + r + "' given twice");
        recipes.push_back(r);
    }
    if (recipes.empty() || list.back() == ',') throw Error("--recipe '" + list + "': an empty recipe name");
    return recipes;
}

// Loss curves as an SVG chart a person reads: per recipe the raw training loss (thin, light:
// spikes show as spikes), its mean over 10 steps (thick), and the held-out loss after the last
// step (a diamond at the right edge, its value in the legend). The y axis spans the losses of the
// second half of the steps and the held-out ones, so the gaps between recipes at the end fill the
// chart instead of step 0's ln 256 = 5.5 squeezing them into its bottom; what lies above (the
// early steps, a spike) runs off the top, cut there, with the step-0 loss noted.
void write_svg(const std::string& path, const std::vector<gpt::TrainResult>& runs) {
    static const char* colors[] = {"#000000", "#7f7f7f", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"};
    const double w = 900, h = 500, l = 70, r = 260, t = 50, b = 50;
    size_t steps = 1;
    std::vector<std::vector<float>> smooth;
    for (const auto& run : runs) {
        std::vector<float> s;
        for (size_t i = 0; i < run.losses.size(); ++i) {
            const size_t from = i >= 9 ? i - 9 : 0;
            double sum = 0;
            for (size_t j = from; j <= i; ++j) sum += run.losses[j];
            s.push_back(float(sum / double(i - from + 1)));
        }
        steps = std::max(steps, s.size());
        smooth.push_back(std::move(s));
    }
    // The range: smoothed and raw losses of the second half of the steps, and the held-out losses.
    double lo = 1e30, hi = -1e30;
    for (size_t i = 0; i < runs.size(); ++i) {
        for (size_t s = smooth[i].size() / 2; s < smooth[i].size(); ++s) {
            lo = std::min({lo, double(smooth[i][s]), double(runs[i].losses[s])});
            hi = std::max(hi, double(smooth[i][s]));
        }
        lo = std::min(lo, double(runs[i].final_loss));
        hi = std::max(hi, double(runs[i].final_loss));
    }
    const double pad = std::max(0.05 * (hi - lo), 1e-3);
    lo -= pad;
    hi += pad;
    std::ostringstream o;
    auto x_of = [&](double i) { return l + (w - l - r) * i / double(std::max<size_t>(1, steps - 1)); };
    auto y_of = [&](double v) { return t + (h - t - b) * (hi - v) / (hi - lo); };
    o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h << "\" font-family=\"sans-serif\" font-size=\"13\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << l << "\" y=\"20\">fp8kit train: training loss per recipe - raw (thin), mean of 10 steps (thick);</text>\n"
      << "<text x=\"" << l << "\" y=\"38\">diamond: held-out loss after the last step. y axis: the losses from step " << steps / 2
      << " on (step 0: " << std::fixed << std::setprecision(2) << (runs.empty() || runs[0].losses.empty() ? 0.0 : double(runs[0].losses[0]))
      << " runs off the top)</text>\n"
      << "<defs><clipPath id=\"plot\"><rect x=\"" << l << "\" y=\"" << t << "\" width=\"" << w - l - r << "\" height=\"" << h - t - b
      << "\"/></clipPath></defs>\n"
      << "<rect x=\"" << l << "\" y=\"" << t << "\" width=\"" << w - l - r << "\" height=\"" << h - t - b << "\" fill=\"none\" stroke=\"#444\"/>\n";
    const int decimals = hi - lo < 0.5 ? 3 : 2;
    for (int k = 0; k <= 5; ++k) {
        const double v = lo + (hi - lo) * k / 5.0;
        o << "<text x=\"" << l - 8 << "\" y=\"" << y_of(v) + 4 << "\" text-anchor=\"end\">" << std::setprecision(decimals) << v << "</text>\n"
          << "<line x1=\"" << l << "\" x2=\"" << w - r << "\" y1=\"" << y_of(v) << "\" y2=\"" << y_of(v) << "\" stroke=\"#ddd\"/>\n";
        const double s = double(steps - 1) * k / 5.0;
        o << "<text x=\"" << x_of(s) << "\" y=\"" << h - b + 18 << "\" text-anchor=\"middle\">" << long(std::lround(s)) << "</text>\n";
    }
    o << "<text x=\"" << (l + w - r) / 2 << "\" y=\"" << h - 12 << "\" text-anchor=\"middle\">step</text>\n"
      << "<text x=\"18\" y=\"" << (t + h - b) / 2 << "\" transform=\"rotate(-90 18 " << (t + h - b) / 2
      << ")\" text-anchor=\"middle\">loss (nats/byte)</text>\n";
    const auto polyline = [&](const std::vector<float>& v, const char* col, double width, double opacity, const char* cls) {
        o << "<polyline class=\"" << cls << "\" clip-path=\"url(#plot)\" fill=\"none\" stroke=\"" << col << "\" stroke-width=\"" << width
          << "\" stroke-opacity=\"" << opacity << "\" points=\"" << std::setprecision(1);
        for (size_t s = 0; s < v.size(); ++s) o << x_of(double(s)) << "," << y_of(v[s]) << " ";
        o << "\"/>\n";
    };
    for (size_t i = 0; i < runs.size(); ++i) {
        const char* col = colors[i % 7];
        polyline(runs[i].losses, col, 0.8, 0.35, "raw");
        polyline(smooth[i], col, 2.0, 1.0, "smoothed");
        const double fx = x_of(double(steps - 1)) + 8 + 5 * double(i % 3), fy = y_of(runs[i].final_loss);
        o << std::setprecision(1) << "<path class=\"held-out\" d=\"M" << fx << "," << fy - 6 << " l6,6 l-6,6 l-6,-6 z\" fill=\"" << col
          << "\" stroke=\"white\"/>\n";
        const double ly = t + 20 * double(i) + 10;
        o << "<line x1=\"" << w - r + 25 << "\" x2=\"" << w - r + 50 << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\"" << col
          << "\" stroke-width=\"2\"/>\n<text x=\"" << w - r + 56 << "\" y=\"" << ly + 4 << "\">" << runs[i].recipe
          << " - held-out " << std::setprecision(3) << runs[i].final_loss << "</text>\n";
    }
    o << "</svg>\n";
    write_file(path, o.str());
}

std::string mib(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", double(bytes) / 1048576.0);
    return buf;
}

void run_train(const TrainArgs& a) {
    // Every argument is checked before any work or output (the numbers were, as they were parsed).
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(a.out, ec)) && !std::filesystem::is_directory(a.out, ec))
        throw Error("--out '" + a.out + "' exists and is not a directory");
    std::vector<std::string> recipes = parse_recipes(a.recipe);
    gpt::TrainConfig c;
    if (a.device == "cuda") {
        try {
            (void)backend_for(Device::cuda);  // this build and machine can run it, or why not
        } catch (const Error& e) {
            throw Error("--device cuda: " + std::string(e.what()));
        }
        c.device = Device::cuda;
        if (a.recipe == "all") {
            recipes.erase(std::find(recipes.begin(), recipes.end(), "bf16"));
            std::cerr << "fp8kit train: --device cuda leaves out the bf16 recipe (it emulates bf16 on the host)\n";
        } else if (std::find(recipes.begin(), recipes.end(), "bf16") != recipes.end()) {
            throw Error("--recipe bf16 runs on the host only (it emulates bf16 GEMM inputs there), not with --device cuda");
        }
    } else if (a.device != "cpu") {
        throw Error("--device '" + a.device + "': expected cpu or cuda");
    }
    c.seed = a.seed;
    c.steps = a.steps;
    c.model.layers = a.layers;
    c.model.width = a.width;
    c.batch = a.batch;
    if (a.width % c.model.heads != 0)
        throw Error("--width " + std::to_string(a.width) + " must be a multiple of the " + std::to_string(c.model.heads) + " attention heads");
    try {
        c.validate();  // the model and the training fit in this machine's memory
    } catch (const Error& e) {
        throw Error("--layers / --width / --batch: " + std::string(e.what()));
    }
    // The input files, each error naming its flag (exit 3).
    const auto read_input = [](const char* flag, const auto& read) {
        try {
            read();
        } catch (const Error& e) {
            throw BadInput(std::string(flag) + ": " + e.what());
        }
    };
    if (!a.policy.empty()) read_input("--policy", [&] { c.policy = read_policy(a.policy); });
    std::string owned;
    if (!a.data.empty()) read_input("--data", [&] { owned = read_file(a.data); });
    const std::string_view text = a.data.empty() ? gpt::builtin_corpus() : std::string_view(owned);
    try {
        gpt::check_training_text(text, c);
    } catch (const Error& e) {
        throw BadInput("--data '" + a.data + "': " + e.what());  // the built-in corpus far outgrows the fixed context
    }
    set_num_threads(a.threads);
    writing_output([&] { std::filesystem::create_directories(a.out); });
    std::cerr << "fp8kit train: GPT " << c.model.layers << " layers, width " << c.model.width << ", " << c.model.heads
              << " heads, context " << c.model.context << ", batch " << c.batch << ", " << c.steps << " steps, "
              << text.size() << " bytes of text, " << num_threads() << " threads, seed " << c.seed << ", on "
              << to_string(c.device) << "\n";
    if (c.policy)
        for (const auto& r : recipes)
            if (!is_fp8_recipe(r)) std::cerr << "fp8kit train: --policy applies to the FP8 recipes; " << r << " ignores it\n";
    std::vector<gpt::TrainResult> runs;
    // The bar redraws itself with \r: only on a terminal. Into a file or a CI log each recipe
    // gets one line when it ends.
    const bool bar = stderr_is_terminal();
    for (const auto& recipe : recipes) {
        const auto progress = [&](int64_t step, float loss) {
            const int width = 30, done = int(double(width) * double(step + 1) / double(c.steps));
            std::fprintf(stderr, "\r%-10s [%s%s] %5lld/%lld loss %.3f", recipe.c_str(), std::string(size_t(done), '#').c_str(),
                         std::string(size_t(width - done), '.').c_str(), (long long)(step + 1), (long long)c.steps, double(loss));
        };
        runs.push_back(gpt::train_gpt(text, c, recipe, bar ? progress : std::function<void(int64_t, float)>()));
        if (bar) {
            std::fprintf(stderr, " (%.1f s)\n", runs.back().seconds);
        } else {
            std::fprintf(stderr, "%-10s %lld steps, loss %.3f (%.1f s)\n", recipe.c_str(), (long long)c.steps,
                         double(runs.back().losses.back()), runs.back().seconds);
        }
        writing_output([&] { gpt::save_model(*runs.back().model, a.out + "/model_" + recipe + ".safetensors"); });
    }
    // The table
    const gpt::TrainResult* f32 = nullptr;
    for (const auto& r : runs)
        if (r.recipe == "f32") f32 = &r;
    std::vector<bench::Row> rows;
    for (const auto& r : runs) {
        char loss[32], gap[32], tps[32];
        std::snprintf(loss, sizeof loss, "%.4f", double(r.final_loss));
        if (f32) std::snprintf(gap, sizeof gap, "%+.2f%%", 100.0 * (double(r.final_loss) / double(f32->final_loss) - 1.0));
        std::snprintf(tps, sizeof tps, "%.0f", r.tokens_per_second);
        rows.push_back(bench::Row()
                           .add("recipe", r.recipe)
                           .add("final loss", std::string(loss))
                           .add("gap to f32", f32 ? std::string(gap) : std::string("-"))
                           .add("tokens/s", std::string(tps))
                           .add("weights MiB", mib(r.weight_bytes))
                           .add("activations MiB", mib(r.activation_bytes)));
    }
    bench::print_rows(std::cout, rows, false);
    std::cout << "\nfinal loss: held-out (last 10% of the text), nats per byte. tokens/s: after the warm-up steps"
                 " (gpt::TrainResult::tokens_per_second). weights: float32 parameters + grads + AdamW state; activations:"
                 " what forward keeps for backward.\n";
    if (c.policy) {
        std::cout << "\n--policy " << a.policy << ": which layers ran in FP8, and why\n";
        for (const auto& r : runs)
            if (is_fp8_recipe(r.recipe)) std::cout << r.recipe << ":\n" << r.conversion << "\n";
    }
    // Curves
    std::ostringstream csv;
    csv << "step";
    for (const auto& r : runs) csv << "," << r.recipe;
    csv << "\n";
    for (int64_t s = 0; s < c.steps; ++s) {
        csv << s;
        for (const auto& r : runs) csv << "," << r.losses[size_t(s)];
        csv << "\n";
    }
    writing_output([&] {
        write_file(a.out + "/losses.csv", csv.str());
        write_svg(a.out + "/losses.svg", runs);
    });
    std::cout << "wrote " << a.out << "/losses.csv, " << a.out << "/losses.svg and " << a.out << "/model_<recipe>.safetensors\n";
}

}  // namespace

void add_train_command(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("train", "train the small GPT with every recipe (f32, bf16, FP8) and compare");
    auto a = std::make_shared<TrainArgs>();
    cmd->add_option("--data", a->data, "text file to train on (default: the built-in corpus)")->check(not_empty);
    add_integer(cmd, "--steps", a->steps, 1, max_steps, "training steps per recipe");
    cmd->add_option("--recipe", a->recipe, "all, or a comma list of f32, bf16, tensorwise, rowwise, block, delayed, mxfp8");
    add_integer(cmd, "--threads", a->threads, 1, max_threads, "threads (1 by default: see the comment on TrainArgs)");
    add_integer(cmd, "--seed", a->seed, 0, INT64_MAX, "initialisation and data order");
    cmd->add_option("--out", a->out, "output folder (default fp8kit-train)")->check(not_empty);
    // The model's own limits (gpt::GPTConfig::validate); memory is checked against the machine.
    add_integer(cmd, "--layers", a->layers, 1, 1024, "model layers");
    add_integer(cmd, "--width", a->width, 1, 65536, "model width");
    add_integer(cmd, "--batch", a->batch, 1, max_batch, "sequences per step");
    cmd->add_option("--policy", a->policy, "policy file (fp8kit advise): per layer FP8 or not and the recipe, for the FP8 recipes")
        ->check(not_empty);
    cmd->add_option("--device", a->device, "cpu, or cuda: every layer on the GPU (without the bf16 recipe)")->capture_default_str();
    cmd->callback([a] { run_train(*a); });
}

void add_generate_command(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("generate", "sample text from a model saved by fp8kit train (float32, or FP8 after fp8kit quantize)");
    auto model = std::make_shared<std::string>();
    auto prompt = std::make_shared<std::string>();
    auto tokens = std::make_shared<int64_t>(200);
    auto seed = std::make_shared<uint64_t>(1);
    cmd->add_option("--model", *model, "model file (fp8kit-train/model_<recipe>.safetensors)")->required()->check(not_empty);
    cmd->add_option("--prompt", *prompt, "text to continue");
    add_integer(cmd, "--tokens", *tokens, 1, max_tokens, "bytes to generate");
    add_integer(cmd, "--seed", *seed, 0, INT64_MAX, "sampling seed");
    cmd->callback([=] {
        std::unique_ptr<gpt::GPT> m;
        reading_inputs([&] { m = gpt::load_model(*model); });
        // Each byte printed as it is sampled; the rate (without the model's load) on stderr.
        std::cout << *prompt << std::flush;
        const auto t0 = std::chrono::steady_clock::now();
        gpt::generate(*m, *prompt, *tokens, *seed, [](char c) { std::cout << c << std::flush; });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::cout << "\n";
        std::cerr << *tokens << " bytes in " << std::fixed << std::setprecision(3) << s << " s: "
                  << std::setprecision(1) << double(*tokens) / s << " tokens/s\n";
    });
}

// `fp8kit bench generate`: the models given (e.g. a float32 model and its FP8 quantization) sample
// the same bytes' worth in turn, round after round, so that the machine's noise hits them alike;
// the fastest round of each, as tokens/s and as a multiple of the first model's. Checks its own
// results: a model's text must be the same in every round (sampling is seeded).
void add_generate_bench(CLI::App& bench) {
    CLI::App* cmd = bench.add_subcommand("generate", "fp8kit generate's tokens/s for each model given, in turn (e.g. float32 vs FP8)");
    auto models = std::make_shared<std::vector<std::string>>();
    auto tokens = std::make_shared<int64_t>(100);
    auto rounds = std::make_shared<int64_t>(3);
    auto json = std::make_shared<bool>(false);
    cmd->add_option("--model", *models, "model file (repeat the flag for each model; the first is the baseline)")->required()->check(not_empty);
    add_integer(cmd, "--tokens", *tokens, 1, max_tokens, "bytes to generate per round");
    add_integer(cmd, "--rounds", *rounds, 1, max_rounds, "rounds (the fastest of each model's is reported)");
    cmd->add_flag("--json", *json, "one JSON object per line");
    cmd->callback([=] {
        std::vector<std::unique_ptr<gpt::GPT>> ms;
        reading_inputs([&] {
            for (const std::string& path : *models) ms.push_back(gpt::load_model(path));
        });
        const std::string prompt = "The ";
        std::vector<double> best(ms.size(), 1e300);
        std::vector<std::string> text(ms.size());
        for (int64_t r = 0; r < *rounds; ++r) {
            for (size_t i = 0; i < ms.size(); ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                const std::string out = gpt::generate(*ms[i], prompt, *tokens, 1);
                best[i] = std::min(best[i], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
                if (r == 0) text[i] = out;
                if (out != text[i]) throw CheckFailed("bench generate: " + (*models)[i] + " sampled different bytes in round " + std::to_string(r + 1) + " (seeded: must repeat)");
            }
        }
        std::cout << std::fixed;
        if (!*json) std::cout << "model                                                   width  layers   tokens/s   x first\n";
        for (size_t i = 0; i < ms.size(); ++i) {
            const double rate = double(*tokens) / best[i], first = double(*tokens) / best[0];
            const gpt::GPTConfig& c = ms[i]->config();
            if (*json) {  // built by nlohmann::json: the model path escaped as JSON needs
                const auto cents = [](double v) { return std::round(v * 100.0) / 100.0; };
                std::cout << nlohmann::ordered_json{{"bench", "generate"}, {"model", (*models)[i]}, {"width", c.width},
                                                    {"layers", c.layers}, {"threads", num_threads()}, {"tokens", *tokens},
                                                    {"tokens_per_s", cents(rate)}, {"vs_first", cents(rate / first)}}
                                 .dump()
                          << "\n";
            } else {
                std::cout << std::left << std::setw(56) << printable((*models)[i]) << std::right << std::setw(6) << c.width << std::setw(8)
                          << c.layers << std::setprecision(1) << std::setw(11) << rate << std::setprecision(2) << std::setw(10)
                          << rate / first << "\n";
            }
        }
    });
}

}  // namespace fp8kit::tools
