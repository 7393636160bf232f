// fp8kit/files.hpp: the file-system services the command line and applications need from the
// library's platform layer, so that they never reach into it (tests/layering.cmake), and text from
// files made safe to show on a terminal.
// Checked by tests/unit/test_platform.cpp (the platform calls underneath, printable) and the e2e
// tests of the commands that use them (tests/e2e/hostile_inputs.py: names holding escape sequences).
#pragma once

#include <string>
#include <string_view>

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

// `text` (a name or a value read from a file) as it may be shown on a terminal: valid UTF-8 is
// kept except the control characters (C0, DEL, C1), which become \n, \t, \r or \xHH; a byte
// that is not part of valid UTF-8 becomes \xHH. Every message or table line that shows what a file
// holds passes it through here, so a name cannot move the cursor, recolour or retitle a terminal.
std::string printable(std::string_view text);
// printable(text) in single quotes: how a message names a tensor, file or key read from a file;
// beyond quote_printable_max bytes, its start, "..." and the length of text in bytes.
inline constexpr size_t quote_printable_max = 200;
std::string quote_printable(std::string_view text);
// printable(text) cut as quote_printable cuts it, unquoted: how a message shows a value read from
// a file (a JSON value, a parser's excerpt), which may be megabytes long.
std::string printable_cut(std::string_view text);

}  // namespace fp8kit
