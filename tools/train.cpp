// tools/train.cpp: `fp8kit train` - the main job: trains the default small GPT of the GPT app
// (tools/gpt/gpt.hpp) on the built-in corpus (or --data FILE) once per recipe (f32, bf16, FP8
// tensorwise, rowwise, block, delayed) and seed - every recipe of a seed from the same
// initialisation and data order - several runs at a time (one per core), with a progress bar on
// stderr; prints the table (held-out loss, gap to f32 as the mean over the seeds with its 95%
// interval and each seed's gap, tokens/s, memory), writes loss curves (CSV + SVG plot) and each
// recipe's model of the first seed to --out; --policy applies a policy file (fp8kit advise) to
// the FP8 recipes; --device cuda trains on the GPU.
// `fp8kit generate` samples from a saved model (float32, or quantized by fp8kit quantize), each
// byte printed as it is sampled and the rate on stderr; `fp8kit bench generate` times models in turn.
// Every argument is checked before any work or output (an error naming the flag).
// Checked by tests/e2e/test_cli.sh (the table and its statistics, files, generate, --policy's
// report, each refused argument leaving nothing behind) and tests/e2e/test_losses_svg.sh.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "numbers.hpp"
#include "bench/common.hpp"
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
    // One thread per run by default: the default model's GEMMs are small (512 x 128 x 128), and
    // on a 2-core machine that is also busy with other work every parallel region waits for a
    // descheduled thread. The cores are used by running several trainings at once instead
    // (--jobs), which needs no synchronisation between them. --threads N uses N per run.
    int threads = 1;
    // Runs at a time; 0: one per --threads cores (std::thread::hardware_concurrency). 1 on cuda.
    int jobs = 0;
    uint64_t seed = 1;
    // Every recipe is trained from seeds seed, seed + 1, ...: one seed's gap to f32 is that
    // seed's trajectory as much as the recipe's cost; the table gives the mean and its interval.
    int64_t seeds = 3;
};

// The largest values the numeric flags take: beyond them a run would not end in any useful time
// (the sizes are also checked against the machine's memory, gpt::check_fits_memory).
constexpr int64_t max_steps = 10'000'000, max_tokens = 1'000'000, max_rounds = 1000, max_batch = 1'000'000, max_threads = 1024,
                  max_seeds = 1000;

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
        if (r.empty()) throw Error("--recipe " + quote_printable(list) + ": an empty recipe name");
        if (!known(r)) throw Error("--recipe: unknown recipe " + quote_printable(r) + " (all, or a comma list of f32, bf16, tensorwise, rowwise, block, delayed, mxfp8)");
        if (std::find(recipes.begin(), recipes.end(), r) != recipes.end()) throw Error("--recipe: " + quote_printable(r) + " given twice");
        recipes.push_back(r);
    }
    if (recipes.empty() || list.back() == ',') throw Error("--recipe " + quote_printable(list) + ": an empty recipe name");
    return recipes;
}

// Loss curves as an SVG chart a person reads (each run here is a recipe's mean over the seeds,
// the held-out loss too): per recipe the raw training loss (thin, light:
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
      << "<text x=\"" << l << "\" y=\"20\">fp8kit train: training loss per recipe, mean over the seeds - raw (thin), mean of 10 steps (thick);</text>\n"
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

// The 95% two-sided quantile of Student's t with `dof` degrees of freedom: the interval of a
// mean of dof + 1 seeds is mean +- t * s / sqrt(n) (s: the seeds' sample standard deviation).
double t_quantile_95(int64_t dof) {
    static const double t[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                               2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086};
    return dof <= 20 ? t[dof - 1] : dof <= 30 ? 2.042 : 1.960;  // 30 and beyond: t(30), then the normal's
}

// One recipe's runs, one per seed (in the order of the seeds), summed up for the table and plot.
struct RecipeRuns {
    std::string recipe;
    std::vector<gpt::TrainResult> runs;
    // The training loss per step and the held-out loss, as means over the seeds.
    gpt::TrainResult mean() const {
        gpt::TrainResult m;
        m.recipe = recipe;
        m.losses.assign(runs[0].losses.size(), 0.0f);
        double held_out = 0, tps = 0;
        for (const auto& r : runs) {
            for (size_t i = 0; i < m.losses.size(); ++i) m.losses[i] += r.losses[i] / float(runs.size());
            held_out += double(r.final_loss) / double(runs.size());
            tps += r.tokens_per_second / double(runs.size());
        }
        m.final_loss = float(held_out);
        m.tokens_per_second = tps;
        m.weight_bytes = runs[0].weight_bytes;
        m.activation_bytes = runs[0].activation_bytes;
        return m;
    }
};

// Per seed, the recipe's held-out loss against f32's of the same seed (the same initialisation
// and data order): the relative gap.
std::vector<double> gaps_to(const RecipeRuns& r, const RecipeRuns& f32) {
    std::vector<double> g;
    for (size_t i = 0; i < r.runs.size(); ++i) g.push_back(double(r.runs[i].final_loss) / double(f32.runs[i].final_loss) - 1.0);
    return g;
}

std::string percent(double v, const char* fmt = "%+.2f%%") {
    char buf[32];
    std::snprintf(buf, sizeof buf, fmt, 100.0 * v);
    return buf;
}

void run_train(const TrainArgs& a) {
    // Every argument is checked before any work or output (the numbers were, as they were parsed).
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(a.out, ec)) && !std::filesystem::is_directory(a.out, ec))
        throw Error("--out " + quote_printable(a.out) + " exists and is not a directory");
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
        throw Error("--device " + quote_printable(a.device) + ": expected cpu or cuda");
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
        throw BadInput("--data " + quote_printable(a.data) + ": " + e.what());  // the built-in corpus far outgrows the fixed context
    }
    // The runs: every recipe from every seed. The GPU trains one at a time (one device, one stream).
    const size_t seeds = size_t(a.seeds), n_runs = recipes.size() * seeds;
    const int cores = std::max(1, int(std::thread::hardware_concurrency()) / a.threads);
    const size_t jobs = c.device == Device::cuda ? 1 : std::min(n_runs, size_t(a.jobs > 0 ? a.jobs : cores));
    set_num_threads(a.threads);
    writing_output([&] { std::filesystem::create_directories(a.out); });
    std::cerr << "fp8kit train: GPT " << c.model.layers << " layers, width " << c.model.width << ", " << c.model.heads
              << " heads, context " << c.model.context << ", batch " << c.batch << ", " << c.steps << " steps, "
              << text.size() << " bytes of text, seeds " << a.seed;
    if (seeds > 1) std::cerr << "-" << a.seed + seeds - 1;
    std::cerr << ", " << n_runs << " runs, " << jobs << " at a time, " << num_threads() << " threads each, on " << to_string(c.device)
              << "\n";
    if (c.policy)
        for (const auto& r : recipes)
            if (!is_fp8_recipe(r)) std::cerr << "fp8kit train: --policy applies to the FP8 recipes; " << r << " ignores it\n";
    std::vector<RecipeRuns> table(recipes.size());
    for (size_t i = 0; i < recipes.size(); ++i) {
        table[i].recipe = recipes[i];
        table[i].runs.resize(seeds);
    }
    // The bar (all runs' steps) redraws itself with \r: only on a terminal. Into a file or a CI
    // log each run gets one line when it ends.
    const bool bar = stderr_is_terminal();
    const int64_t total_steps = int64_t(n_runs) * c.steps;
    std::atomic<size_t> next{0}, finished{0};
    std::atomic<int64_t> steps_done{0};
    std::mutex err_mutex;  // stderr and the first error
    std::exception_ptr error;
    const auto draw = [&] {
        const int width = 30, done = int(double(width) * double(steps_done) / double(total_steps));
        std::fprintf(stderr, "\rtraining [%s%s] %lld/%lld steps, %zu/%zu runs", std::string(size_t(done), '#').c_str(),
                     std::string(size_t(width - done), '.').c_str(), (long long)steps_done.load(), (long long)total_steps,
                     finished.load(), n_runs);
    };
    // Run i is recipe i % recipes, seed i / recipes: the seeds come in turn, every recipe of one
    // seed before the next seed's.
    const auto worker = [&] {
        set_num_threads(a.threads);  // OpenMP's thread count is per thread: each worker sets its own
        for (size_t i = next++; i < n_runs; i = next++) {
            {
                std::lock_guard lock(err_mutex);
                if (error) return;
            }
            const size_t ri = i % recipes.size(), si = i / recipes.size();
            gpt::TrainConfig rc = c;
            rc.seed = a.seed + si;
            try {
                const auto progress = [&](int64_t, float) {
                    ++steps_done;
                    std::lock_guard lock(err_mutex);
                    draw();
                };
                gpt::TrainResult r = gpt::train_gpt(text, rc, recipes[ri], bar ? progress : std::function<void(int64_t, float)>());
                if (!bar) steps_done += c.steps;
                ++finished;
                std::lock_guard lock(err_mutex);
                if (bar) {
                    draw();
                } else {
                    std::fprintf(stderr, "%-10s seed %llu: %lld steps, loss %.3f (%.1f s)\n", recipes[ri].c_str(),
                                 (unsigned long long)rc.seed, (long long)c.steps, double(r.losses.back()), r.seconds);
                }
                table[ri].runs[si] = std::move(r);
            } catch (...) {
                std::lock_guard lock(err_mutex);
                if (!error) error = std::current_exception();
                return;
            }
        }
    };
    std::vector<std::thread> pool;
    for (size_t j = 1; j < jobs; ++j) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    if (bar) std::fprintf(stderr, "\n");
    if (error) std::rethrow_exception(error);
    writing_output([&] {
        for (const auto& r : table) gpt::save_model(*r.runs[0].model, a.out + "/model_" + r.recipe + ".safetensors");
    });
    // The table
    const RecipeRuns* f32 = nullptr;
    for (const auto& r : table)
        if (r.recipe == "f32") f32 = &r;
    std::vector<bench::Row> rows;
    std::vector<gpt::TrainResult> means;
    for (const auto& r : table) {
        means.push_back(r.mean());
        const gpt::TrainResult& m = means.back();
        char loss[32], tps[32];
        std::snprintf(loss, sizeof loss, "%.4f", double(m.final_loss));
        std::snprintf(tps, sizeof tps, "%.0f", m.tokens_per_second);
        std::string gap = "-", interval = "-", each = "-";
        if (f32) {
            const std::vector<double> g = gaps_to(r, *f32);
            double mean = 0, var = 0;
            for (double v : g) mean += v / double(g.size());
            for (double v : g) var += (v - mean) * (v - mean) / double(std::max<size_t>(1, g.size() - 1));
            gap = percent(mean);
            if (&r != f32 && g.size() > 1) {
                interval = percent(t_quantile_95(int64_t(g.size()) - 1) * std::sqrt(var / double(g.size())), "%.2f%%");
                each.clear();
                for (double v : g) each += (each.empty() ? "" : "/") + percent(v, "%+.2f");
            }
        }
        rows.push_back(bench::Row()
                           .add("recipe", r.recipe)
                           .add("final loss", std::string(loss))
                           .add("gap to f32", gap)
                           .add("+- 95%", interval)
                           .add("per seed %", each)
                           .add("tokens/s", std::string(tps))
                           .add("weights MiB", mib(m.weight_bytes))
                           .add("activations MiB", mib(m.activation_bytes)));
    }
    bench::print_rows(std::cout, rows, false);
    std::cout << "\nfinal loss: held-out (last 10% of the text), nats per byte, the mean over " << seeds
              << " seed(s). gap to f32: per seed the recipe's held-out loss against f32's of the same seed (the same"
                 " initialisation and data), averaged; +- 95%: the half-width of that mean's 95% interval (Student's t"
                 " over the seeds). A gap within its +- is seed noise, not a cost of the recipe. tokens/s: after the"
                 " warm-up steps, the mean over the seeds (runs share the machine: --jobs). weights: float32 parameters"
                 " + grads + AdamW state; activations: what forward keeps for backward.\n";
    if (c.policy) {
        std::cout << "\n--policy " << a.policy << ": which layers ran in FP8, and why\n";
        for (const auto& r : table)
            if (is_fp8_recipe(r.recipe)) std::cout << r.recipe << ":\n" << r.runs[0].conversion << "\n";
    }
    // Curves: every run's training loss in the CSV, each recipe's mean over the seeds in the plot.
    std::ostringstream csv;
    csv << "step";
    for (const auto& r : table)
        for (size_t si = 0; si < seeds; ++si) csv << "," << r.recipe << (seeds > 1 ? " seed " + std::to_string(a.seed + si) : "");
    csv << "\n";
    for (int64_t s = 0; s < c.steps; ++s) {
        csv << s;
        for (const auto& r : table)
            for (const auto& run : r.runs) csv << "," << run.losses[size_t(s)];
        csv << "\n";
    }
    writing_output([&] {
        write_file(a.out + "/losses.csv", csv.str());
        write_svg(a.out + "/losses.svg", means);
    });
    std::cout << "wrote " << a.out << "/losses.csv, " << a.out << "/losses.svg and " << a.out
              << "/model_<recipe>.safetensors (seed " << a.seed << ")\n";
}

}  // namespace

void add_train_command(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("train", "train the small GPT with every recipe (f32, bf16, FP8) and compare");
    auto a = std::make_shared<TrainArgs>();
    cmd->add_option("--data", a->data, "text file to train on (default: the built-in corpus)")->check(not_empty);
    add_integer(cmd, "--steps", a->steps, 1, max_steps, "training steps per recipe");
    cmd->add_option("--recipe", a->recipe, "all, or a comma list of f32, bf16, tensorwise, rowwise, block, delayed, mxfp8");
    add_integer(cmd, "--threads", a->threads, 1, max_threads, "threads per run (default 1: see the comment on TrainArgs)");
    add_integer(cmd, "--jobs", a->jobs, 0, max_threads, "runs at a time (default 0: one per --threads cores; the GPU runs one)");
    add_integer(cmd, "--seed", a->seed, 0, INT64_MAX, "the first seed (initialisation and data order)");
    add_integer(cmd, "--seeds", a->seeds, 1, max_seeds, "seeds per recipe: the gap to f32 is their mean, with its 95% interval");
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
