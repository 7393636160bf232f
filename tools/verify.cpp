// tools/verify.cpp: `fp8kit verify A B [--min-sqnr DB] [--json]` - per tensor of A (FP8 weights
// dequantized through their scales, other floating tensors as they are), SQNR in dB and the max
// absolute error of B's values against A's, computed in double. A check fails (exit 4) for every
// tensor missing from B or of another shape, holding NaN or Inf in A or B, or (with --min-sqnr)
// below the floor; all failing tensors are listed, not the first.
// Checked by tests/e2e/test_checkpoint.sh and tests/e2e/test_checkpoint_safety.sh.
#include <cmath>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "checkpoint_commands.hpp"
#include "commands.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "numbers.hpp"

namespace fp8kit::tools {

namespace {

using Json = nlohmann::ordered_json;

struct VerifyArgs {
    std::string a, b;
    double min_sqnr = -INFINITY;
    bool json = false;
};

bool numeric(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f64 || is_fp8(d); }

struct Result {
    std::string name;
    ErrorStats e{NAN, NAN};
    std::string failure;  // empty: passed
};

void run_verify(const VerifyArgs& args) {
    std::unique_ptr<Checkpoint> a, b;
    std::vector<Result> results;
    reading_inputs([&] {
        a = std::make_unique<Checkpoint>(args.a);
        b = std::make_unique<Checkpoint>(args.b);
        for (const std::string& name : a->names()) {
            if (is_scale_name(*a, name) || !numeric(a->entry(name).dtype)) continue;
            Result r;
            r.name = name;
            if (!b->contains(name)) {
                r.failure = "missing from " + args.b;
            } else {
                const Tensor va = values_f32(*a, name), vb = values_f32(*b, name);
                const auto na = find_non_finite(va), nb = find_non_finite(vb);
                if (va.shape() != vb.shape()) {
                    r.failure = "shape " + to_string(va.shape()) + " in A, " + to_string(vb.shape()) + " in B";
                } else {
                    r.e = compare(va, vb);
                    if (na) r.failure = na->kind + " at " + na->index + " in A (" + std::to_string(na->count) + " non-finite)";
                    if (nb) r.failure += (r.failure.empty() ? "" : "; ") + nb->kind + " at " + nb->index + " in B (" + std::to_string(nb->count) + " non-finite)";
                    if (r.failure.empty() && !(r.e.sqnr_db >= args.min_sqnr)) {
                        char buf[96];
                        std::snprintf(buf, sizeof buf, "SQNR %.2f dB below --min-sqnr %.2f", r.e.sqnr_db, args.min_sqnr);
                        r.failure = buf;
                    }
                }
            }
            results.push_back(std::move(r));
        }
    });
    const Result* worst = nullptr;
    for (const Result& r : results)
        if (r.failure.empty() && (!worst || r.e.sqnr_db < worst->e.sqnr_db)) worst = &r;
    std::vector<const Result*> failed;
    for (const Result& r : results)
        if (!r.failure.empty()) failed.push_back(&r);
    if (args.json) {
        // JSON has no Inf: an exact match has sqnr_db null and exact true.
        const auto num = [](double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); };
        Json t = Json::array();
        for (const Result& r : results) {
            t.push_back({{"name", r.name}, {"sqnr_db", num(r.e.sqnr_db)}, {"exact", r.e.sqnr_db == INFINITY},
                         {"max_abs", num(r.e.max_abs)}, {"ok", r.failure.empty()},
                         {"failure", r.failure.empty() ? Json(nullptr) : Json(r.failure)}});
        }
        std::printf("%s\n", Json{{"a", args.a}, {"b", args.b}, {"min_sqnr", num(args.min_sqnr)}, {"tensors", std::move(t)},
                                 {"failed", failed.size()}, {"ok", failed.empty()}}.dump().c_str());
    } else {
        std::printf("%-52s %12s %14s\n", "tensor", "SQNR dB", "max abs error");
        for (const Result& r : results)
            std::printf("%-52s %12.2f %14.6g%s\n", printable(r.name).c_str(), r.e.sqnr_db, r.e.max_abs, r.failure.empty() ? "" : "  FAILED");
        if (worst) std::printf("lowest SQNR: %.2f dB (%s)\n", worst->e.sqnr_db, printable(worst->name).c_str());
    }
    if (!failed.empty()) {
        std::string msg = std::to_string(failed.size()) + " tensor(s) failed the check:";
        for (const Result* r : failed) msg += "\n  " + printable(r->name) + ": " + r->failure;
        throw CheckFailed(msg);
    }
}

}  // namespace

void add_verify_command(CLI::App& app) {
    auto a = std::make_shared<VerifyArgs>();
    CLI::App* c = app.add_subcommand("verify", "per-tensor SQNR and max error of checkpoint B against A");
    c->add_option("A", a->a, "reference checkpoint (file or directory)")->required()->check(not_empty);
    c->add_option("B", a->b, "checkpoint to check (file or directory)")->required()->check(not_empty);
    add_real(c, "--min-sqnr", a->min_sqnr, -1000, 1000, "fail (exit 4) when a tensor's SQNR is below this many dB");
    c->add_flag("--json", a->json, "print one JSON object on stdout instead of the table");
    c->footer(std::string("A tensor fails when missing from B, of another shape, holding NaN or Inf in A or B, or below --min-sqnr.\n"
                          "Examples:\n  fp8kit verify model/ model-fp8/ --min-sqnr 25\n  fp8kit verify model/ model-fp8/ --json\n") +
              exit_codes_help);
    c->callback([a] { run_verify(*a); });
}

}  // namespace fp8kit::tools
