// fp8kit/error.hpp: the one exception type fp8kit throws for invalid arguments, and printable(),
// through which a message shows any text it was given (a name, a value read from a file).
//
// Messages name the argument, the value received and what was expected, e.g.
//   "fp8kit::encode: out.size() is 7, expected in.size() = 8".
// Checked by tests/unit/test_platform.cpp (printable) and the tests of each message.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace fp8kit {

class Error : public std::invalid_argument {
public:
    explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

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
