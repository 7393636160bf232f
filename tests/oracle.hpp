// tests/oracle.hpp: running a Python oracle (a script in tests/ on the venv's Python: PyTorch,
// the safetensors package) - or another program, such as the built fp8kit command - from a
// GoogleTest test, for the tests that check fp8kit against code written elsewhere. An oracle
// exits 0 on success, 77 when what it needs is not installed (the test is then skipped with the
// oracle's stderr as the reason), anything else on failure.
// Built for the build machine only (these tests are left out of cross builds, tests/CMakeLists.txt),
// so this is the one test file allowed the POSIX <sys/wait.h> (tests/platform_confinement.cmake).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support.hpp"  // unique_temp_stem

namespace fp8kit::test {

inline std::string read_file(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct OracleRun {
    enum class Outcome { passed, skipped, failed } outcome;
    std::string message;  // why skipped or failed: the oracle's stderr, or what kept it from running
};

// Runs `program args...` (each argument one shell word, whatever it holds) with stderr captured:
// passed on exit 0, skipped on 77, failed otherwise.
inline OracleRun run_program(const std::string& program, const std::vector<std::string>& args) {
    std::string cmd;
    const auto append_quoted = [&cmd](const std::string& s) {  // one shell word, whatever it holds
        cmd.push_back('\'');
        for (char ch : s) {
            if (ch == '\'') cmd.append("'\\''");
            else cmd.push_back(ch);
        }
        cmd.append("' ");
    };
    const std::string err_path = unique_temp_stem("oracle") + ".err";
    append_quoted(program);
    for (const std::string& a : args) append_quoted(a);
    cmd.append("2>");
    append_quoted(err_path);
    const int status = std::system(cmd.c_str());
    std::string err = read_file(err_path);
    std::filesystem::remove(err_path);
    if (status == -1 || !WIFEXITED(status)) return {OracleRun::Outcome::failed, "could not run " + cmd};
    if (WEXITSTATUS(status) == 77) return {OracleRun::Outcome::skipped, err};
    if (WEXITSTATUS(status) != 0)
        return {OracleRun::Outcome::failed, program + (args.empty() ? "" : " " + args.front()) + " exited with " +
                                                std::to_string(WEXITSTATUS(status)) + ":\n" + err};
    return {OracleRun::Outcome::passed, err};
}

// Runs `python script args...` (run_program); skipped when there is no Python.
inline OracleRun run_oracle(const std::string& python, const std::string& script, const std::vector<std::string>& args) {
    if (!std::filesystem::exists(python))
        return {OracleRun::Outcome::skipped, "no Python at " + python + " (scripts/setup.sh creates the venv)"};
    std::vector<std::string> argv{script};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(python, argv);
}

}  // namespace fp8kit::test
