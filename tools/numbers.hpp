// tools/numbers.hpp: the one parser of the `fp8kit` command's numeric flags. Every integer and
// real flag of every subcommand is registered through add_integer / add_real: its text must be a
// plain decimal number (an integer: optional '-' and digits; a real: also a fraction and an
// exponent) with nothing before or after it, finite (no nan, inf), within the flag's range; else
// a usage error (exit 2) naming the flag, the text and the range, raised while the command line
// is parsed - before the command reads, allocates or creates anything.
// Checked by tests/e2e/hostile_inputs.py (every numeric flag of every command fed random strings,
// against an independent strict parser).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

namespace fp8kit::tools {

// The value of `text` for `flag`, or fp8kit::Error naming both and [lo, hi].
int64_t parse_integer(std::string_view flag, std::string_view text, int64_t lo, int64_t hi);
double parse_real(std::string_view flag, std::string_view text, double lo, double hi);

// Registers `flag` on `c`; when given, its value is parsed as above into `var` (which keeps its
// default otherwise). The range is shown in the help.
template <class T>
CLI::Option* add_integer(CLI::App* c, const std::string& flag, T& var, int64_t lo, int64_t hi, const std::string& help) {
    return c
        ->add_option_function<std::string>(
            flag, [&var, flag, lo, hi](const std::string& text) { var = static_cast<T>(parse_integer(flag, text, lo, hi)); },
            help + " (an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]; default " + std::to_string(var) + ")")
        ->type_name("INT");
}
CLI::Option* add_real(CLI::App* c, const std::string& flag, double& var, double lo, double hi, const std::string& help);

}  // namespace fp8kit::tools
