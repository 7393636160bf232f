// tools/fp8kit.cpp: the `fp8kit` command - its subcommands and exit codes (tools/commands.hpp:
// 0 success, 1 internal error, 2 usage error, 3 bad input, 4 a check failed), each error one
// line (or a list) on stderr. Checked by tests/e2e/test_cli.sh and tests/e2e/test_checkpoint*.sh.
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/version.hpp"

int main(int argc, char** argv) {
    using namespace fp8kit::tools;
    CLI::App app{"fp8kit: exact FP8 formats, scaling and scaled GEMM"};
    app.name("fp8kit");
    app.set_version_flag("--version", "fp8kit " FP8KIT_VERSION_STRING);
    app.require_subcommand(1);
    app.footer(std::string("Each subcommand's --help shows its options and examples.\n") + exit_codes_help);
    add_formats_command(app);
    add_bench_command(app);
    add_train_command(app);
    add_generate_command(app);
    add_quantize_command(app);
    add_inspect_command(app);
    add_dequantize_command(app);
    add_verify_command(app);
    add_advise_command(app);
    // An unknown first word is named as an unknown subcommand (CLI11 would call it an unexpected argument).
    if (argc > 1 && argv[1][0] != '-') {
        bool known = false;
        std::string names;
        for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) {
            known = known || s->get_name() == argv[1];
            names += (names.empty() ? "" : ", ") + s->get_name();
        }
        if (!known) {
            std::cerr << "fp8kit: error: unknown subcommand '" << argv[1] << "' (subcommands: " << names << ")\n";
            return exit_usage;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e);  // --help, --version
    } catch (const CLI::ParseError& e) {
        std::cerr << "fp8kit: error: " << e.what() << " (see fp8kit --help)\n";
        return exit_usage;
    } catch (const CheckFailed& e) {
        std::cerr << "fp8kit: check failed: " << e.what() << "\n";
        return exit_check_failed;
    } catch (const BadInput& e) {
        std::cerr << "fp8kit: error: " << e.what() << "\n";
        return exit_bad_input;
    } catch (const fp8kit::Error& e) {
        std::cerr << "fp8kit: error: " << e.what() << "\n";
        return exit_usage;
    } catch (const std::exception& e) {
        std::cerr << "fp8kit: internal error: " << e.what() << "\n";
        return exit_internal;
    }
    return exit_ok;
}
