// src/io/files.cpp: <fp8kit/files.hpp> over the platform layer (src/platform/platform.hpp).
// Checked by tests/unit/test_platform.cpp and the e2e tests of the commands that read and write
// files (tests/e2e/hostile_inputs.py).
#include "fp8kit/files.hpp"

#include "platform/platform.hpp"

namespace fp8kit {

void write_file(const std::string& path, std::string_view bytes) {
    platform::ReplacingFile f(path);
    f.write(bytes.data(), bytes.size());
    f.commit();
}

std::string read_file(const std::string& path) {
    const platform::MappedFile f(path);
    return std::string(reinterpret_cast<const char*>(f.data()), f.size());
}

bool stderr_is_terminal() noexcept { return platform::stderr_is_terminal(); }

}  // namespace fp8kit
