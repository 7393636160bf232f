// src/io/json.hpp: how the io layer parses the JSON it reads from files - safetensors headers,
// config.json and index files, a quantization_config, policy files - and shows a JSON value in a
// message. Checked by tests/unit/test_safetensors.cpp (nesting, duplicate keys, long values) and
// tests/python/test_fp8_checkpoints.py (configs nested past the limit).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fp8kit::detail {

using Json = nlohmann::ordered_json;  // keeps a file's order: a header's names are file order

// How deep a JSON file fp8kit reads may nest (a config.json's quantization_config is about 5
// deep). Deeper is refused while parsing, before a value is built that printing it would recurse
// through as deeply: 100,000 levels of [] overflowed the stack.
inline constexpr int json_max_depth = 64;

// text parsed as JSON; fp8kit::Error "<what>: not valid JSON (...)", "<what>: JSON nests deeper
// than <max_depth> levels", and with unique_keys "<what>: JSON has the key 'k' twice".
Json parse_json(std::string_view text, const std::string& what, int max_depth = json_max_depth, bool unique_keys = false);

// v's JSON text for a message: printable, and cut as quote_printable cuts a name.
std::string shown(const Json& v);

}  // namespace fp8kit::detail
