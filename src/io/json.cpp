// src/io/json.cpp: the io layer's JSON parsing (nesting bounded, duplicate keys refused where
// asked) and values shown in messages (src/io/json.hpp). Checked by tests/unit/test_safetensors.cpp
// and tests/python/test_fp8_checkpoints.py.
#include "io/json.hpp"

#include <set>
#include <vector>

#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"

namespace fp8kit::detail {

Json parse_json(std::string_view text, const std::string& what, int max_depth, bool unique_keys) {
    std::vector<std::set<std::string>> keys;  // one set per open object
    const auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
        if (depth > max_depth) throw Error(what + ": JSON nests deeper than " + std::to_string(max_depth) + " levels");
        if (!unique_keys) return true;
        if (event == Json::parse_event_t::object_start) {
            keys.emplace_back();
        } else if (event == Json::parse_event_t::object_end) {
            keys.pop_back();
        } else if (event == Json::parse_event_t::key) {
            const std::string& k = parsed.get_ref<const std::string&>();
            if (!keys.back().insert(k).second) throw Error(what + ": JSON has the key " + quote_printable(k) + " twice (duplicate name)");
        }
        return true;
    };
    try {
        return Json::parse(text.begin(), text.end(), check);
    } catch (const Json::exception& e) {
        throw Error(what + ": not valid JSON (" + printable_cut(e.what()) + ")");
    }
}

std::string shown(const Json& v) { return printable_cut(v.dump()); }

}  // namespace fp8kit::detail
