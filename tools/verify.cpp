// tools/verify.cpp: `fp8kit verify A B [--min-sqnr DB]` - per tensor of A (FP8 weights dequantized
// through their scales, other floating tensors as they are), SQNR in dB and the max absolute error
// of B's values against A's, computed in double. With --min-sqnr, a tensor below it, or missing
// from B, is an error (exit code 2). Checked by tests/e2e/test_checkpoint.sh.
#include <cmath>
#include <cstdio>
#include <memory>

#include "checkpoint.hpp"
#include "commands.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit::tools {

namespace {

struct VerifyArgs {
    std::string a, b;
    double min_sqnr = -INFINITY;
};

bool numeric(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f64 || is_fp8(d); }

void run_verify(const VerifyArgs& args) {
    const Checkpoint a(args.a), b(args.b);
    std::printf("%-52s %12s %14s\n", "tensor", "SQNR dB", "max abs error");
    std::string worst;
    double worst_sqnr = INFINITY;
    for (const std::string& name : a.names()) {
        if (is_scale_name(a, name) || !numeric(a.shard(a.shard_of(name)).entry(name).dtype)) continue;
        if (!b.contains(name)) throw Error(args.b + ": no tensor named '" + name + "' (it is in " + args.a + ")");
        const ErrorStats e = compare(values_f32(a, name), values_f32(b, name));
        std::printf("%-52s %12.2f %14.6g\n", name.c_str(), e.sqnr_db, e.max_abs);
        if (!(e.sqnr_db >= worst_sqnr)) {
            worst_sqnr = e.sqnr_db;
            worst = name;
        }
    }
    if (!worst.empty()) std::printf("lowest SQNR: %.2f dB (%s)\n", worst_sqnr, worst.c_str());
    if (!worst.empty() && !(worst_sqnr >= args.min_sqnr)) {
        throw Error("tensor '" + worst + "': SQNR " + std::to_string(worst_sqnr) + " dB is below --min-sqnr " +
                    std::to_string(args.min_sqnr));
    }
}

}  // namespace

void add_verify_command(CLI::App& app) {
    auto a = std::make_shared<VerifyArgs>();
    CLI::App* c = app.add_subcommand("verify", "per-tensor SQNR and max error of checkpoint B against A");
    c->add_option("A", a->a, "reference checkpoint (file or directory)")->required();
    c->add_option("B", a->b, "checkpoint to check (file or directory)")->required();
    c->add_option("--min-sqnr", a->min_sqnr, "fail (exit 2) when a tensor's SQNR is below this many dB");
    c->callback([a] { run_verify(*a); });
}

}  // namespace fp8kit::tools
