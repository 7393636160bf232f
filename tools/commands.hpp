// tools/commands.hpp: each `fp8kit` subcommand registers itself on the app (one file each).
// A command's callback runs after parsing; it reports errors by throwing fp8kit::Error.
#pragma once

#include <CLI/CLI.hpp>

namespace fp8kit::tools {

void add_formats_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_dequantize_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_advise_command(CLI::App& app);

}  // namespace fp8kit::tools
