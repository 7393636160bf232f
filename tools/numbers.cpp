// tools/numbers.cpp: strict parsing of the command's numeric flags (numbers.hpp).
// Checked by tests/e2e/hostile_inputs.py.
#include "numbers.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"

namespace fp8kit::tools {

namespace {

std::string show(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

[[noreturn]] void refuse(std::string_view flag, std::string_view text, const std::string& want) {
    throw Error(std::string(flag) + " '" + printable(text) + "': expected " + want);
}

// Only what a person writes as a decimal number: [-]digits[.digits][(e|E)[-|+]digits] (no
// leading '+', spaces, hex, inf or nan, which std::from_chars would partly accept).
bool plain_decimal(std::string_view t, bool real) {
    size_t i = 0;
    const auto digits = [&] {
        const size_t from = i;
        while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
        return i > from;
    };
    if (i < t.size() && t[i] == '-') ++i;
    const bool whole = digits();
    if (!real) return whole && i == t.size();
    bool fraction = false;
    if (i < t.size() && t[i] == '.') {
        ++i;
        fraction = digits();
    }
    if (!whole && !fraction) return false;
    if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
        ++i;
        if (i < t.size() && (t[i] == '-' || t[i] == '+')) ++i;
        if (!digits()) return false;
    }
    return i == t.size();
}

}  // namespace

int64_t parse_integer(std::string_view flag, std::string_view text, int64_t lo, int64_t hi) {
    const std::string want = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    int64_t v = 0;
    if (!plain_decimal(text, false)) refuse(flag, text, want);
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || v < lo || v > hi) refuse(flag, text, want);
    return v;
}

double parse_real(std::string_view flag, std::string_view text, double lo, double hi) {
    const std::string want = "a finite number in [" + show(lo) + ", " + show(hi) + "]";
    double v = 0;
    if (!plain_decimal(text, true)) refuse(flag, text, want);
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !std::isfinite(v) || v < lo || v > hi) refuse(flag, text, want);
    return v;
}

CLI::Option* add_real(CLI::App* c, const std::string& flag, double& var, double lo, double hi, const std::string& help) {
    return c
        ->add_option_function<std::string>(
            flag, [&var, flag, lo, hi](const std::string& text) { var = parse_real(flag, text, lo, hi); },
            help + " (a number in [" + show(lo) + ", " + show(hi) + "]" + (std::isfinite(var) ? "; default " + show(var) : "") + ")")
        ->type_name("NUMBER");
}

}  // namespace fp8kit::tools
