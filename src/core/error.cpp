// src/core/error.cpp: printable() of <fp8kit/error.hpp>: text given to a message (a name, a value
// read from a file) escaped for a terminal and cut to a length a message can show.
// Checked by tests/unit/test_platform.cpp (printable) and tests/e2e/hostile_inputs.py.
#include "fp8kit/error.hpp"

namespace fp8kit {

namespace {
// The length of the valid UTF-8 sequence at s[i] (1 to 4), or 0 where none starts there
// (overlong forms, surrogates and code points above U+10FFFF are not valid).
size_t utf8_length(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
    const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
    const unsigned char c = b(0);
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (!cont(1) || !cont(2)) return 0;
        if ((c == 0xE0 && b(1) < 0xA0) || (c == 0xED && b(1) > 0x9F)) return 0;  // overlong, surrogate
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (!cont(1) || !cont(2) || !cont(3)) return 0;
        if ((c == 0xF0 && b(1) < 0x90) || (c == 0xF4 && b(1) > 0x8F)) return 0;  // overlong, > U+10FFFF
        return 4;
    }
    return 0;
}

// The characters that reorder the text around them on a terminal (Unicode's bidirectional
// controls, "Trojan Source"): U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069 - a name holding
// one would show in a message as another name.
bool bidi_control(std::string_view ch) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(ch[k]); };
    if (ch.size() == 2) return b(0) == 0xD8 && b(1) == 0x9C;
    if (ch.size() != 3 || b(0) != 0xE2) return false;
    return (b(1) == 0x80 && (b(2) == 0x8E || b(2) == 0x8F || (b(2) >= 0xAA && b(2) <= 0xAE))) ||
           (b(1) == 0x81 && b(2) >= 0xA6 && b(2) <= 0xA9);
}
}  // namespace

std::string printable(std::string_view text) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(text.size());
    const auto escape = [&](unsigned char c) {
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
    };
    for (size_t i = 0; i < text.size();) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        const size_t n = utf8_length(text, i);
        if (n == 0) {
            escape(c);
            ++i;
            continue;
        }
        if (n == 1) {
            switch (c) {
                case '\n': out += "\\n"; break;
                case '\t': out += "\\t"; break;
                case '\r': out += "\\r"; break;
                default:
                    if (c < 0x20 || c == 0x7F) escape(c);
                    else out += char(c);
            }
        } else if ((n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) <= 0x9F) || bidi_control(text.substr(i, n))) {
            // U+0080..U+009F: the C1 controls (CSI is U+009B); the bidirectional controls
            for (size_t k = 0; k < n; ++k) escape(static_cast<unsigned char>(text[i + k]));
        } else {
            out.append(text.substr(i, n));
        }
        i += n;
    }
    return out;
}

namespace {
// A name or value from a hostile file can be megabytes long: a message shows its first
// quote_printable_max bytes of escaped text (cut at a character's start), and in `tail` its length.
std::string cut_printable(std::string_view text, std::string& tail) {
    std::string p = printable(text);
    if (p.size() > quote_printable_max) {
        size_t cut = quote_printable_max;
        while (cut > 0 && (static_cast<unsigned char>(p[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 sequence
        p.resize(cut);
        tail = "... (" + std::to_string(text.size()) + " bytes)";
    }
    return p;
}
}  // namespace

std::string quote_printable(std::string_view text) {
    std::string tail;
    const std::string p = cut_printable(text, tail);
    return "'" + p + "'" + tail;
}

std::string printable_cut(std::string_view text) {
    std::string tail;
    const std::string p = cut_printable(text, tail);
    return p + tail;
}

}  // namespace fp8kit
