// tools/commands.hpp: each `fp8kit` subcommand registers itself on the app (one file each).
// A command's callback runs after parsing; it reports errors by throwing fp8kit::Error (a usage
// error: a bad option or argument), BadInput (an input file the command cannot use) or
// CheckFailed (a check the user asked for failed); tools/fp8kit.cpp turns each into its exit code.
#pragma once

#include <CLI/CLI.hpp>

#include "fp8kit/error.hpp"

namespace fp8kit::tools {

// The exit codes, documented in `fp8kit --help` and each command's --help.
inline constexpr int exit_ok = 0, exit_internal = 1, exit_usage = 2, exit_bad_input = 3, exit_check_failed = 4;
inline constexpr const char* exit_codes_help =
    "Exit codes: 0 success; 1 internal error (a bug); 2 usage error (unknown subcommand, bad option or "
    "argument, an output path refused); 3 bad input (an input file missing, malformed, or holding what the "
    "command refuses, e.g. non-finite weights); 4 a check failed (verify).";

struct BadInput : Error {
    using Error::Error;
};
struct CheckFailed : Error {
    using Error::Error;
};
// Runs fn, the part of a command that reads its inputs: an fp8kit::Error from it is BadInput.
template <class F>
void reading_inputs(F&& fn) {
    try {
        fn();
    } catch (const BadInput&) {
        throw;
    } catch (const CheckFailed&) {
        throw;
    } catch (const Error& e) {
        throw BadInput(e.what());
    }
}

void add_formats_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_generate_bench(CLI::App& bench);  // `fp8kit bench generate` (tools/train.cpp: the GPT app's)
void add_train_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_dequantize_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_advise_command(CLI::App& app);

}  // namespace fp8kit::tools
