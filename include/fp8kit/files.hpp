// fp8kit/files.hpp: the file-system services the command line and applications need from the
// library's platform layer, so that they never reach into it (tests/layering.cmake); printable(),
// which makes text from files safe to show on a terminal, is in <fp8kit/error.hpp>.
// Checked by tests/unit/test_platform.cpp (the platform calls underneath, printable) and the e2e
// tests of the commands that use them (tests/e2e/hostile_inputs.py: names holding escape sequences).
#pragma once

#include <string>
#include <string_view>

#include "fp8kit/error.hpp"

namespace fp8kit {

// Replaces `path` with `bytes` whole or not at all: a temporary beside it, flushed, then renamed
// over it; an interrupt (INT, TERM) or an error leaves neither a half-written file nor the
// temporary. fp8kit::Error naming the path.
void write_file(const std::string& path, std::string_view bytes);

// The whole of a regular file (never a FIFO, device or directory: those are refused before any
// blocking open). fp8kit::Error naming the path and the reason.
std::string read_file(const std::string& path);

// Whether standard error is a terminal (where progress bars are drawn).
bool stderr_is_terminal() noexcept;


}  // namespace fp8kit
