// tools/commands.hpp: each `fp8kit` subcommand registers itself on the app (one file each).
// A command's callback runs after parsing; it reports errors by throwing fp8kit::Error (a usage
// error: a bad option or argument), BadInput (an input file the command cannot use),
// CheckFailed (a check the user asked for failed) or OutputFailed (writing the output failed);
// tools/fp8kit.cpp turns each into its exit code.
#pragma once

#include <CLI/CLI.hpp>

#include "fp8kit/error.hpp"

namespace fp8kit::tools {

// The exit codes, documented in `fp8kit --help`, each command's --help, the README and
// docs/CHECKPOINTS.md; each one is produced by tests/e2e/hostile_inputs.py.
inline constexpr int exit_ok = 0, exit_internal = 1, exit_usage = 2, exit_bad_input = 3, exit_check_failed = 4,
                     exit_output_failed = 5;
inline constexpr const char* exit_codes_help =
    "Exit codes: 0 success; 1 internal error (a bug, or memory exhausted); 2 usage error (unknown subcommand, bad option or "
    "argument, an output path refused); 3 bad input (an input file missing, not a regular file, malformed, or holding "
    "what the command refuses, e.g. non-finite weights or scales); 4 a check failed (verify); 5 the output could not "
    "be written (nothing is left behind).";

struct BadInput : Error {
    using Error::Error;
};
struct CheckFailed : Error {
    using Error::Error;
};
struct OutputFailed : Error {
    using Error::Error;
};
// Runs fn, the part of a command that reads its inputs: an fp8kit::Error from it is BadInput
// (unless it is already one of the command's own kinds).
template <class F>
void reading_inputs(F&& fn) {
    try {
        fn();
    } catch (const BadInput&) {
        throw;
    } catch (const CheckFailed&) {
        throw;
    } catch (const OutputFailed&) {
        throw;
    } catch (const Error& e) {
        throw BadInput(e.what());
    }
}
// Runs fn, a step that writes the output (a temporary, a shard, the final rename): an
// fp8kit::Error from it is OutputFailed.
template <class F>
void writing_output(F&& fn) {
    try {
        fn();
    } catch (const Error& e) {
        throw OutputFailed(e.what());
    }
}

// A path option's check: an empty path is a usage error naming the option (CLI11 adds its name).
inline const CLI::Validator not_empty([](std::string& s) { return s.empty() ? std::string("the path is empty") : std::string(); }, "PATH");

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
