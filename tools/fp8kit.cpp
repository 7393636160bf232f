// tools/fp8kit.cpp: the `fp8kit` command. Errors become one line on stderr and exit code 2.
// Checked by tests/e2e/test_cli.sh.
#include <exception>
#include <iostream>

#include "commands.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/version.hpp"

int main(int argc, char** argv) {
    CLI::App app{"fp8kit: exact FP8 formats, scaling and scaled GEMM"};
    app.name("fp8kit");
    app.set_version_flag("--version", "fp8kit " FP8KIT_VERSION_STRING);
    app.require_subcommand(1);
    fp8kit::tools::add_formats_command(app);
    fp8kit::tools::add_bench_command(app);
    fp8kit::tools::add_train_command(app);
    fp8kit::tools::add_generate_command(app);
    fp8kit::tools::add_quantize_command(app);
    fp8kit::tools::add_inspect_command(app);
    fp8kit::tools::add_dequantize_command(app);
    fp8kit::tools::add_verify_command(app);
    fp8kit::tools::add_advise_command(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e);  // --help, --version
    } catch (const CLI::ParseError& e) {
        std::cerr << "fp8kit: error: " << e.what() << " (see fp8kit --help)\n";
        return 2;
    } catch (const fp8kit::Error& e) {
        std::cerr << "fp8kit: error: " << e.what() << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "fp8kit: internal error: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
