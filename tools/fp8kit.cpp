// tools/fp8kit.cpp: the `fp8kit` command - its subcommands and exit codes (tools/commands.hpp:
// 0 success, 1 internal error, 2 usage error, 3 bad input, 4 a check failed, 5 output failed),
// each error one line (or a list) on stderr, control characters escaped.
// Checked by tests/e2e/test_cli.sh, tests/e2e/test_checkpoint*.sh and tests/e2e/hostile_inputs.py.
#include <cstring>
#include <exception>
#include <new>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
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
            std::cerr << "fp8kit: error: unknown subcommand " << fp8kit::quote_printable(argv[1]) << " (subcommands: " << names << ")\n";
            return exit_usage;
        }
    }
    // Every message line passes through printable(): whatever a file held (a tensor name with
    // escape sequences) reaches the terminal escaped, whichever path raised it; the library and
    // the commands already quote names so; the line breaks of a list are the messages' own.
    const auto report = [](const char* kind, const char* what) {
        const std::string text(what);
        std::string out = std::string("fp8kit: ") + kind + ": ";
        for (size_t at = 0;;) {
            const size_t nl = text.find('\n', at);
            out += fp8kit::printable(std::string_view(text).substr(at, nl == std::string::npos ? std::string::npos : nl - at));
            if (nl == std::string::npos) break;
            out += '\n';
            at = nl + 1;
        }
        std::cerr << out << "\n";
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e);  // --help, --version
    } catch (const CLI::ParseError& e) {
        report("error", (std::string(e.what()) + " (see fp8kit --help)").c_str());
        return exit_usage;
    } catch (const CheckFailed& e) {
        report("check failed", e.what());
        return exit_check_failed;
    } catch (const BadInput& e) {
        report("error", e.what());
        return exit_bad_input;
    } catch (const OutputFailed& e) {
        report("error writing the output", e.what());
        return exit_output_failed;
    } catch (const fp8kit::Error& e) {
        report("error", e.what());
        return exit_usage;
    } catch (const std::bad_alloc&) {
        report("error", "out of memory (the sizes asked for need more memory than this machine gives)");
        return exit_internal;
    } catch (const std::exception& e) {
        report("internal error", e.what());
        return exit_internal;
    }
    return exit_ok;
}
