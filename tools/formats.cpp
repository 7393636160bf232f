// tools/formats.cpp: `fp8kit formats` prints every FP8 format's limits and special-value rules,
// straight from fp8kit::format_info (the same table the encoder uses), and the CPU code path.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::tools {

namespace {

// "448" or "2^-9 (0.001953125)": powers of two show their exponent, all exactly.
std::string show(float v) {
    int e = 0;
    const float m = std::frexp(v, &e);
    char buf[64];
    if (m == 0.5f && (e - 1 < -4 || e - 1 > 16)) {
        std::snprintf(buf, sizeof buf, "2^%d (%.9g)", e - 1, double(v));
    } else if (m == 0.5f && e - 1 < 0) {
        std::snprintf(buf, sizeof buf, "2^%d (%.9g)", e - 1, double(v));
    } else {
        std::snprintf(buf, sizeof buf, "%.9g", double(v));
    }
    return buf;
}

void print_formats() {
    std::printf("%-9s %-5s %-4s %-18s %-22s %-22s %-11s %-9s %-42s %s\n", "format", "E/M", "bias",
                "max", "min normal", "min subnormal", "epsilon", "Inf", "NaN", "-0");
    for (Format f : all_formats) {
        const FormatInfo fi = format_info(f);
        const std::string em = std::to_string(fi.exponent_bits) + "/" + std::to_string(fi.mantissa_bits);
        const std::string subnormal = fi.min_subnormal == fi.min_normal ? "none" : show(fi.min_subnormal);
        std::printf("%-9s %-5s %-4d %-18s %-22s %-22s %-11s %-9s %-42s %s\n", std::string(fi.name).c_str(),
                    em.c_str(), fi.bias, show(fi.max).c_str(), show(fi.min_normal).c_str(),
                    subnormal.c_str(), show(fi.epsilon).c_str(),
                    fi.has_inf ? "0x7c 0xfc" : "none", std::string(fi.nan_rule).c_str(),
                    fi.has_neg_zero ? "0x80" : (fi.has_sign ? "none (0x80 is NaN)" : "none (unsigned)"));
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
