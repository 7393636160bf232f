// tools/bench.cpp: `fp8kit bench <name> [--json] [--quick]` runs the benchmark of bench/<name>
// (the same code as the bench_<name> binary); `fp8kit bench generate` is the GPT app's (tools/train.cpp).
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "bench/common.hpp"

namespace fp8kit::tools {

void add_bench_command(CLI::App& app) {
    CLI::App* bench = app.add_subcommand("bench", "measure fp8kit side by side with its peers (see docs/PERF.md)");
    bench->require_subcommand(1);
    auto opt = std::make_shared<bench::Options>();
    CLI::App* convert = bench->add_subcommand("convert", "bulk FP8 conversion vs memcpy of the same bytes");
    convert->add_flag("--json", opt->json, "one JSON object per line");
    convert->add_flag("--quick", opt->quick, "fewer cases and repetitions (under a minute)");
    convert->callback([opt] { bench::run_convert(*opt, std::cout); });
    CLI::App* quantize = bench->add_subcommand("quantize", "quantize / cast_transpose per scaling vs memcpy of the input");
    quantize->add_flag("--json", opt->json, "one JSON object per line");
    quantize->add_flag("--quick", opt->quick, "fewer cases and repetitions (under a minute)");
    quantize->callback([opt] { bench::run_quantize(*opt, std::cout); });
    CLI::App* gemm = bench->add_subcommand("gemm", "scaled FP8 GEMM vs OpenBLAS and oneDNN, the FMA peak and read bandwidth");
    gemm->add_flag("--json", opt->json, "one JSON object per line");
    gemm->add_flag("--quick", opt->quick, "512 square and M = 1, 8, 12, 16 at 4096 x 4096, short budgets");
    gemm->callback([opt] {
        if (bench::run_gemm(*opt, std::cout) != 0) throw CheckFailed("bench gemm: a result outside its error bound (above)");
    });
    CLI::App* layers = bench->add_subcommand("layers", "the layer ops (matmul, norms, GELU, attention, ...) on the cpu backend, checked against ref");
    layers->add_flag("--json", opt->json, "one JSON object per line");
    layers->add_flag("--quick", opt->quick, "the training shapes only, short budgets");
    layers->callback([opt] { bench::run_layers(*opt, std::cout); });
    add_generate_bench(*bench);
}

}  // namespace fp8kit::tools
