// src/core/format.cpp: names of formats and overflow modes, parsed and printed.
// Checked by tests/unit/test_format.cpp (every name, alias and a rejected one).
#include <string>

#include "fp8kit/error.hpp"
#include "fp8kit/format.hpp"

namespace fp8kit {

namespace {

struct FormatName {
    std::string_view name;
    Format format;
};

// Canonical names first, then the aliases users type: the short OCP names and the ml_dtypes /
// PyTorch dtype names.
constexpr FormatName format_names[] = {
    {"e4m3fn", Format::e4m3fn},           {"e5m2", Format::e5m2},
    {"e4m3fnuz", Format::e4m3fnuz},       {"e5m2fnuz", Format::e5m2fnuz},
    {"e8m0fnu", Format::e8m0fnu},         {"e4m3", Format::e4m3fn},
    {"e8m0", Format::e8m0fnu},            {"float8_e4m3fn", Format::e4m3fn},
    {"float8_e5m2", Format::e5m2},        {"float8_e4m3fnuz", Format::e4m3fnuz},
    {"float8_e5m2fnuz", Format::e5m2fnuz}, {"float8_e8m0fnu", Format::e8m0fnu},
};

}  // namespace

std::string_view to_string(Format f) noexcept { return format_info(f).name; }

std::string_view to_string(Overflow o) noexcept {
    return o == Overflow::saturate ? "saturate" : "nonsaturating";
}

std::optional<Format> try_parse_format(std::string_view name) noexcept {
    for (const auto& n : format_names) {
        if (n.name == name) return n.format;
    }
    return std::nullopt;
}

Format parse_format(std::string_view name) {
    if (auto f = try_parse_format(name)) return *f;
    throw Error("unknown FP8 format " + quote_printable(name) +
                ", expected one of e4m3fn (alias e4m3), e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu (alias e8m0)");
}

Overflow parse_overflow(std::string_view name) {
    if (name == "saturate" || name == "sat") return Overflow::saturate;
    if (name == "nonsaturating" || name == "nosat") return Overflow::nonsaturating;
    throw Error("unknown overflow mode " + quote_printable(name) +
                ", expected saturate (sat) or nonsaturating (nosat)");
}

}  // namespace fp8kit
