// tools/formats.cpp: `fp8kit formats` prints every FP8 format's limits and special-value rules,
// straight from fp8kit::format_info (the same table the encoder uses), and the CPU code path.
// `--json`: one object per format, through the benchmarks' table/JSON printer (bench/common).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <memory>
#include <vector>

#include "commands.hpp"
#include "bench/common.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::tools {

namespace {

// "448" or "2^-9 (0.001953125)": powers of two far from 1 show their exponent; all exact.
std::string show_exact(float v) {
    int e = 0;
    const bool pow2 = std::frexp(v, &e) == 0.5f && (e - 1 < 0 || e - 1 > 16);
    char buf[64];
    if (pow2) {
        std::snprintf(buf, sizeof buf, "2^%d (%.9g)", e - 1, double(v));
    } else {
        std::snprintf(buf, sizeof buf, "%.9g", double(v));
    }
    return buf;
}

void print_formats(bool json) {
    std::vector<bench::Row> rows;
    for (Format f : all_formats) {
        const FormatInfo fi = format_info(f);
        rows.push_back(bench::Row()
                           .add("format", std::string(fi.name))
                           .add("E/M", std::to_string(fi.exponent_bits) + "/" + std::to_string(fi.mantissa_bits))
                           .add("bias", (long long)fi.bias)
                           .add("max", show_exact(fi.max))
                           .add("min normal", show_exact(fi.min_normal))
                           .add("min subnormal", fi.min_subnormal == fi.min_normal ? "none" : show_exact(fi.min_subnormal))
                           .add("epsilon", show_exact(fi.epsilon))
                           .add("Inf", fi.has_inf ? "0x7c 0xfc" : "none")
                           .add("NaN", std::string(fi.nan_rule))
                           .add("-0", fi.has_neg_zero ? "0x80" : (fi.has_sign ? "none (0x80 is NaN)" : "none (unsigned)")));
    }
    bench::print_rows(std::cout, rows, json);
    if (json) return;
    std::cout << "\nRounding: nearest-even from float32 (e8m0fnu: half up, like ml_dtypes). Overflow:\n"
                 "saturate clamps to +-max (and +-Inf); nonsaturating gives Inf (e5m2) or NaN.\n"
              << "CPU path: " << to_string(active_isa()) << " (supported:";
    for (Isa isa : supported_isas()) std::cout << " " << to_string(isa);
    std::cout << "), threads: " << num_threads() << "\n";
}

}  // namespace

void add_formats_command(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("formats", "print every FP8 format: bits, bias, limits, Inf/NaN/-0 rules");
    auto json = std::make_shared<bool>(false);
    cmd->add_flag("--json", *json, "one JSON object per format");
    cmd->callback([json] { print_formats(*json); });
}

}  // namespace fp8kit::tools
