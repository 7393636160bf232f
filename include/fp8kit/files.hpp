// fp8kit/files.hpp: the two file-system services the command line and applications need from the
// library's platform layer, so that they never reach into it (tests/layering.cmake).
// Checked by tests/unit/test_platform.cpp (the platform calls underneath) and the e2e tests of
// the commands that use them.
#pragma once

#include <string>
#include <string_view>

namespace fp8kit {

// Replaces `path` with `bytes` whole or not at all: a temporary beside it, flushed, then renamed
// over it; an interrupt (INT, TERM) or an error leaves neither a half-written file nor the
// temporary. fp8kit::Error naming the path.
void write_file(const std::string& path, std::string_view bytes);

// Whether standard error is a terminal (where progress bars are drawn).
bool stderr_is_terminal() noexcept;

}  // namespace fp8kit
