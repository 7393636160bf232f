// tools/formats.cpp: `fp8kit formats` prints every FP8 format's limits and special-value rules,
// straight from fp8kit::format_info (the same table the encoder uses), and the CPU code path.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::tools {

namespace {

// "448" or "2^-9 (0.001953125)": powers of two far from 1 show their exponent; all exact.
std::string show(float v) {
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

void print_formats() {
    std::vector<std::vector<std::string>> table = {
        {"format", "E/M", "bias", "max", "min normal", "min subnormal", "epsilon", "Inf", "NaN", "-0"}};
    for (Format f : all_formats) {
        const FormatInfo fi = format_info(f);
        table.push_back({std::string(fi.name), std::to_string(fi.exponent_bits) + "/" + std::to_string(fi.mantissa_bits),
                         std::to_string(fi.bias), show(fi.max), show(fi.min_normal),
                         fi.min_subnormal == fi.min_normal ? "none" : show(fi.min_subnormal), show(fi.epsilon),
                         fi.has_inf ? "0x7c 0xfc" : "none", std::string(fi.nan_rule),
                         fi.has_neg_zero ? "0x80" : (fi.has_sign ? "none (0x80 is NaN)" : "none (unsigned)")});
    }
    std::vector<size_t> width(table[0].size(), 0);
    for (const auto& row : table) {
        for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : table) {
        std::string line;
        for (size_t c = 0; c < row.size(); ++c) {
            line += row[c];
            if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
        }
        std::printf("%s\n", line.c_str());
    }
    std::printf("\nRounding: nearest-even from float32 (e8m0fnu: half up, like ml_dtypes). Overflow:\n"
                "saturate clamps to +-max (and +-Inf); nonsaturating gives Inf (e5m2) or NaN.\n");
    std::printf("CPU path: %s (supported:", std::string(to_string(active_isa())).c_str());
    for (Isa isa : supported_isas()) std::printf(" %s", std::string(to_string(isa)).c_str());
    std::printf("), threads: %d\n", num_threads());
}

}  // namespace

void add_formats_command(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("formats", "print every FP8 format: bits, bias, limits, Inf/NaN/-0 rules");
    cmd->callback(print_formats);
}

}  // namespace fp8kit::tools
