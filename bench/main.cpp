// bench/main.cpp: the entry point of every bench_<name> binary; FP8KIT_BENCH names the benchmark.
// Same options as `fp8kit bench <name>`: --json (JSON lines), --quick (under a minute).
#include <CLI/CLI.hpp>

#include <iostream>

#include "common.hpp"

int main(int argc, char** argv) {
    fp8kit::bench::Options opt;
    CLI::App app{"fp8kit benchmark: " FP8KIT_BENCH_NAME};
    app.add_flag("--json", opt.json, "one JSON object per line");
    app.add_flag("--quick", opt.quick, "fewer cases and repetitions (under a minute)");
    CLI11_PARSE(app, argc, argv);
    return FP8KIT_BENCH_RUN(opt, std::cout);
}
