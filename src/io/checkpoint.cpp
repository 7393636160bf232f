// src/io/checkpoint.cpp: FP8 weight layouts (recognising a stored FP8 weight and its scale as a
// QTensor) and the conversion policy file (fp8kit/checkpoint.hpp).
// Checked by tests/e2e/test_checkpoint.sh (through the fp8kit command, against PyTorch),
// tests/nn/test_checkpoint.cpp (FP8 checkpoints loaded into a model) and tests/nn/test_convert.cpp
// (policies read and applied).
#include "fp8kit/checkpoint.hpp"

#include <nlohmann/json.hpp>

#include "fp8kit/error.hpp"
#include "platform/platform.hpp"

namespace fp8kit {

namespace {

using Json = nlohmann::ordered_json;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// ---- FP8 layouts ----

namespace {
// Each scheme's name (--scheme, quantization_config) and the recipe it stores (policy files).
struct SchemeNames {
    Scheme scheme;
    std::string_view name, recipe;
};
constexpr SchemeNames scheme_names[] = {{Scheme::tensor, "tensor", "tensorwise"},
                                        {Scheme::channel, "channel", "rowwise"},
                                        {Scheme::block128, "block128", "block"},
                                        {Scheme::mx32, "mx32", "mxfp8"}};
const SchemeNames& names_of(Scheme s) noexcept {
    for (const SchemeNames& n : scheme_names)
        if (n.scheme == s) return n;
    return scheme_names[0];  // unreachable: every Scheme has a row
}
}  // namespace

std::string_view to_string(Scheme s) noexcept { return names_of(s).name; }

Scheme parse_scheme(std::string_view text) {
    for (const SchemeNames& n : scheme_names)
        if (n.name == text) return n.scheme;
    throw Error("unknown scheme '" + std::string(text) + "', expected tensor, channel, block128 or mx32");
}

Scaling scaling_of(Scheme s) {
    switch (s) {
        case Scheme::tensor: return Scaling::tensor();
        case Scheme::channel: return Scaling::row();
        case Scheme::block128: return Scaling::block(128, 128);
        case Scheme::mx32: return Scaling::mx32();
    }
    return Scaling::tensor();
}

std::string scale_name(const std::string& weight, Scheme s) {
    return weight + (s == Scheme::block128 ? "_scale_inv" : "_scale");
}

std::string_view recipe_of(Scheme s) noexcept { return names_of(s).recipe; }

Scheme scheme_of_recipe(std::string_view recipe) {
    for (const SchemeNames& n : scheme_names)
        if (n.recipe == recipe) return n.scheme;
    throw Error("policy: unknown recipe '" + std::string(recipe) + "', expected tensorwise, rowwise, block or mxfp8");
}

std::optional<std::vector<int64_t>> weight_block_size(const TensorLookup& t) {
    const auto it = t.metadata().find("quantization_config");
    if (it == t.metadata().end()) return std::nullopt;
    const Json q = Json::parse(it->second, nullptr, false);
    if (!q.is_object() || !q.contains("weight_block_size") || !q["weight_block_size"].is_array()) return std::nullopt;
    std::vector<int64_t> b;
    for (const Json& v : q["weight_block_size"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 1)
            throw Error(t.path() + ": weight_block_size " + q["weight_block_size"].dump() + " is not positive integers");
        b.push_back(v.get<int64_t>());
    }
    if (b.size() != 2) throw Error(t.path() + ": weight_block_size " + q["weight_block_size"].dump() + " is not [rows, cols]");
    return b;
}

std::optional<StoredWeight> stored_weight(const TensorLookup& t, const std::string& name) {
    const Tensor data = t.tensor(name);
    if (!is_fp8(data.dtype()) || data.dtype() == DType::e8m0fnu || data.dim() == 0) return std::nullopt;
    QTensor q;
    q.data = data;
    const int64_t rows = q.rows(), cols = q.cols();
    const std::string where = t.path() + ": FP8 tensor '" + name + "' " + to_string(data.shape());
    Scheme scheme;
    std::string scale;
    if (t.contains(name + "_scale_inv")) {
        scale = name + "_scale_inv";
        const Tensor s = t.tensor(scale);
        const auto b = weight_block_size(t).value_or(std::vector<int64_t>{128, 128});
        q.scaling = Scaling::block(b[0], b[1]);
        if (s.dtype() != DType::f32 || s.numel() != ceil_div(rows, b[0]) * ceil_div(cols, b[1])) {
            throw Error(where + ": " + scale + " is " + std::string(to_string(s.dtype())) + " " + to_string(s.shape()) +
                        ", expected f32 [" + std::to_string(ceil_div(rows, b[0])) + ", " + std::to_string(ceil_div(cols, b[1])) + "]");
        }
        q.scale_inv = s.reshape({ceil_div(rows, b[0]), ceil_div(cols, b[1])});
        scheme = Scheme::block128;
    } else if (t.contains(name + "_scale")) {
        scale = name + "_scale";
        const Tensor s = t.tensor(scale);
        if (s.dtype() == DType::e8m0fnu && s.numel() == rows * ceil_div(cols, 32)) {
            scheme = Scheme::mx32;
        } else if (s.dtype() == DType::f32 && s.numel() == 1) {
            scheme = Scheme::tensor;
        } else if (s.dtype() == DType::f32 && s.numel() == rows && s.dim() >= 1 && s.size(0) == rows) {
            scheme = Scheme::channel;
        } else {
            throw Error(where + ": its scale " + scale + " " + std::string(to_string(s.dtype())) + " " + to_string(s.shape()) +
                        " fits no layout (f32 [1], f32 [rows, 1], e8m0 [rows, ceil(cols/32)])");
        }
        q.scaling = scaling_of(scheme);
        const GroupShape gs = q.scaling.scale_shape(rows, cols);
        q.scale_inv = s.reshape({gs.rows, gs.cols});
    } else {
        return std::nullopt;
    }
    return StoredWeight{scheme, scale, q};
}

bool is_scale_name(const TensorLookup& t, const std::string& name) {
    for (const std::string_view suffix : {"_scale_inv", "_scale"}) {
        if (name.size() > suffix.size() && std::string_view(name).substr(name.size() - suffix.size()) == suffix) {
            const std::string w = name.substr(0, name.size() - suffix.size());
            if (t.contains(w) && stored_weight(t, w)) return true;
        }
    }
    return false;
}

// ---- policy ----

const PolicyLayer* Policy::find(const std::string& weight, const Shape& shape) const {
    for (const PolicyLayer& l : layers) {
        if (!l.name.empty() && (weight == l.name || weight.rfind(l.name + ".", 0) == 0)) return &l;
    }
    for (const PolicyLayer& l : layers) {
        if (l.name.empty() && l.weight_shape == shape) return &l;
    }
    return nullptr;
}

Policy read_policy(const std::string& path) {
    Json j;
    {
        const platform::MappedFile f(path);  // names the file when it cannot be read
        try {
            j = Json::parse(reinterpret_cast<const char*>(f.data()), reinterpret_cast<const char*>(f.data()) + f.size());
        } catch (const Json::exception& e) {
            throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
        }
    }
    const auto bad = [&](const std::string& what) { return Error(path + ": " + what + " (see docs/CHECKPOINTS.md)"); };
    if (!j.is_object() || j.value("format", "") != "fp8kit-policy" || !j.contains("layers") || !j["layers"].is_array()) {
        throw bad("not an fp8kit policy: expected {\"format\": \"fp8kit-policy\", \"version\": 1, \"layers\": [...]}");
    }
    if (j.value("version", 0) != 1) throw bad("unsupported version " + j["version"].dump());
    Policy p;
    for (const Json& l : j["layers"]) {
        PolicyLayer pl;
        if (!l.is_object() || !l.contains("fp8") || !l["fp8"].is_boolean()) throw bad("layer " + l.dump() + " has no boolean 'fp8'");
        pl.fp8 = l["fp8"].get<bool>();
        if (l.contains("name")) {
            if (!l["name"].is_string()) throw bad("layer " + l.dump() + ": 'name' is not a string");
            pl.name = l["name"].get<std::string>();
        }
        if (l.contains("weight_shape")) {
            const Json& s = l["weight_shape"];
            if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer()) {
                throw bad("layer " + l.dump() + ": 'weight_shape' is not [out, in]");
            }
            pl.weight_shape = {s[0].get<int64_t>(), s[1].get<int64_t>()};
        }
        if (pl.name.empty() == pl.weight_shape.empty()) throw bad("layer " + l.dump() + " needs exactly one of 'name' and 'weight_shape'");
        if (l.contains("recipe") && !l["recipe"].is_null()) {
            if (!l["recipe"].is_string()) throw bad("layer " + l.dump() + ": 'recipe' is not a string");
            try {
                pl.scheme = scheme_of_recipe(l["recipe"].get<std::string>());
            } catch (const Error& e) {
                throw bad(e.what());
            }
        }
        if (pl.fp8 && !pl.scheme) throw bad("layer " + l.dump() + " is fp8 but names no recipe");
        pl.reason = l.value("reason", "");
        p.layers.push_back(std::move(pl));
    }
    return p;
}

std::string policy_json(const Policy& p) {
    Json layers = Json::array();
    for (const PolicyLayer& l : p.layers) {
        Json o = Json::object();
        if (!l.name.empty()) o["name"] = l.name;
        if (!l.weight_shape.empty()) o["weight_shape"] = l.weight_shape;
        o["fp8"] = l.fp8;
        o["recipe"] = l.scheme ? Json(recipe_of(*l.scheme)) : Json(nullptr);
        o["reason"] = l.reason;
        layers.push_back(std::move(o));
    }
    return Json{{"format", "fp8kit-policy"}, {"version", 1}, {"layers", std::move(layers)}}.dump(2) + "\n";
}

}  // namespace fp8kit
