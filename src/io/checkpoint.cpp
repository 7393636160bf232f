// src/io/checkpoint.cpp: FP8 weight layouts (recognising a stored FP8 weight and its scale as a
// QTensor) and the conversion policy file (fp8kit/checkpoint.hpp).
// Checked by tests/e2e/test_checkpoint.sh (through the fp8kit command, against PyTorch),
// tests/nn/test_parameters.cpp (FP8 checkpoints loaded into a model) and tests/nn/test_model_conversion.cpp
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
                                        {Scheme::mx32, "mx32", "mxfp8"},
                                        {Scheme::group, "group", ""}};
const SchemeNames& names_of(Scheme s) noexcept {
    for (const SchemeNames& n : scheme_names)
        if (n.scheme == s) return n;
    return scheme_names[0];  // unreachable: every Scheme has a row
}
}  // namespace

std::string_view to_string(Scheme s) noexcept { return names_of(s).name; }

Scheme parse_scheme(std::string_view text) {
    for (const SchemeNames& n : scheme_names)
        if (n.name == text && n.scheme != Scheme::group) return n.scheme;
    throw Error("unknown scheme '" + std::string(text) + "', expected tensor, channel, block128 or mx32");
}

Scaling scaling_of(Scheme s) {
    switch (s) {
        case Scheme::tensor: return Scaling::tensor();
        case Scheme::channel: return Scaling::row();
        case Scheme::block128: return Scaling::block(128, 128);
        case Scheme::mx32: return Scaling::mx32();
        case Scheme::group: break;  // its group size is the checkpoint's
    }
    throw Error("scaling_of: scheme 'group' has no fixed group size");
}

std::string scale_name(const std::string& weight, Scheme s) {
    return weight + (s == Scheme::block128 ? "_scale_inv" : "_scale");
}

std::string_view recipe_of(Scheme s) noexcept { return names_of(s).recipe; }

Scheme scheme_of_recipe(std::string_view recipe) {
    for (const SchemeNames& n : scheme_names)
        if (!n.recipe.empty() && n.recipe == recipe) return n.scheme;
    throw Error("policy: unknown recipe '" + std::string(recipe) + "', expected tensorwise, rowwise, block or mxfp8");
}

namespace {

// What quantization_config says about the weights' scales, in any of the producers' dialects:
// transformers FineGrainedFP8 / DeepSeek-V3 (weight_block_size), compressed-tensors
// (config_groups.*.weights: strategy, block_structure, group_size), fbgemm_fp8 (rows).
struct ConfigScales {
    std::optional<std::vector<int64_t>> block;  // [rows, cols]
    std::optional<int64_t> group_size;
    std::string strategy;  // compressed-tensors' strategy, or "" when not said
};

std::optional<std::vector<int64_t>> block_field(const Json& v, const std::string& what, const std::string& path) {
    if (v.is_null()) return std::nullopt;
    std::vector<int64_t> b;
    if (v.is_array()) {
        for (const Json& x : v) {
            if (!x.is_number_integer() || x.get<int64_t>() < 1) break;
            b.push_back(x.get<int64_t>());
        }
    }
    if (b.size() != 2 || b.size() != v.size()) throw Error(path + ": quantization_config " + what + " " + v.dump() + " is not [rows, cols] of positive integers");
    return b;
}

ConfigScales config_scales(const TensorLookup& t) {
    ConfigScales c;
    const auto text = t.quantization_config();
    if (!text) return c;
    const Json q = Json::parse(*text, nullptr, false);
    if (!q.is_object()) throw Error(t.path() + ": quantization_config is not a JSON object");
    if (q.contains("weight_block_size")) c.block = block_field(q["weight_block_size"], "weight_block_size", t.path());
    if (q.contains("config_groups") && q["config_groups"].is_object()) {
        // Several groups (mixed schemes) are told apart by their scales' shapes; the strategy is
        // cross-checked only when every group has the same one, and the first block and group
        // size named are the ones shapes are checked against.
        bool mixed = false;
        for (const auto& [_, g] : q["config_groups"].items()) {
            if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object()) continue;
            const Json& w = g["weights"];
            const std::string st = w.contains("strategy") && w["strategy"].is_string() ? w["strategy"].get<std::string>() : "";
            if (c.strategy.empty()) c.strategy = st;
            mixed = mixed || st != c.strategy;
            if (!c.block && w.contains("block_structure")) c.block = block_field(w["block_structure"], "block_structure", t.path());
            if (!c.group_size && w.contains("group_size") && w["group_size"].is_number_integer() && w["group_size"].get<int64_t>() > 0)
                c.group_size = w["group_size"].get<int64_t>();
        }
        if (mixed) c.strategy.clear();
    }
    return c;
}

// A scale tensor's values as float32 (f32, bf16 and f16 convert exactly), or as it is (e8m0).
Tensor scale_as_f32(const Tensor& s) {
    if (s.dtype() == DType::f32 || s.dtype() == DType::e8m0fnu) return s;
    const Tensor c = s.contiguous();
    Tensor out = Tensor::empty(c.shape(), DType::f32);
    for (int64_t i = 0; i < c.numel(); ++i)
        out.data<float>()[i] = c.dtype() == DType::bf16 ? float(c.data<const bf16>()[i]) : float(c.data<const f16>()[i]);
    return out;
}

}  // namespace

std::optional<std::vector<int64_t>> weight_block_size(const TensorLookup& t) { return config_scales(t).block; }

std::string input_scale_name(const std::string& weight) {
    const std::string_view suffix = ".weight";
    if (weight.size() <= suffix.size() || std::string_view(weight).substr(weight.size() - suffix.size()) != suffix) return {};
    return weight.substr(0, weight.size() - suffix.size()) + ".input_scale";
}

std::optional<StoredWeight> stored_weight(const TensorLookup& t, const std::string& name) {
    const Tensor data = t.tensor(name);
    if (!is_fp8(data.dtype()) || data.dtype() == DType::e8m0fnu || data.dim() < 2) return std::nullopt;
    QTensor q;
    q.data = data;
    // A 3-D tensor [experts, out, in] (MoE experts) is the matrix [experts * out, in]; its scales
    // are per expert, per expert and channel, or per expert and block.
    const int64_t experts = data.dim() == 3 ? data.size(0) : 1, out = data.size(-2), cols = data.size(-1);
    const int64_t rows = experts * out;
    if (data.dim() > 3) throw Error(t.path() + ": FP8 tensor '" + name + "' " + to_string(data.shape()) + " has more than 3 dimensions");
    const std::string where = t.path() + ": FP8 tensor '" + name + "' " + to_string(data.shape());
    const ConfigScales cfg = config_scales(t);
    StoredWeight w{Scheme::tensor, "", q, {}, ""};
    const bool inv = t.contains(name + "_scale_inv");
    if (!inv && !t.contains(name + "_scale")) return std::nullopt;
    w.scale = name + (inv ? "_scale_inv" : "_scale");
    const Tensor s = scale_as_f32(t.tensor(w.scale));
    const std::string got = std::string(to_string(t.tensor(w.scale).dtype())) + " " + to_string(s.shape());
    if (s.dtype() != DType::f32 && s.dtype() != DType::e8m0fnu)
        throw Error(where + ": its scale " + w.scale + " is " + got + ", expected f32, bf16, f16 or e8m0 values");
    const int64_t n = s.numel();
    const auto block_fits = [&](const std::vector<int64_t>& b) {
        return (experts == 1 || out % b[0] == 0) && n == experts * ceil_div(out, b[0]) * ceil_div(cols, b[1]);
    };
    if (s.dtype() == DType::e8m0fnu) {
        if (n != rows * ceil_div(cols, 32)) throw Error(where + ": its e8m0 scale " + w.scale + " is " + got + ", expected [rows, ceil(cols/32)]");
        w.scheme = Scheme::mx32;
        w.q.scaling = Scaling::mx32();
    } else if (inv || cfg.strategy == "block") {
        // DeepSeek-V3 / FineGrainedFP8 weight_scale_inv, or compressed-tensors' block strategy:
        // one scale per block of the config's size (128 x 128 when it names none).
        const std::vector<int64_t> b = cfg.block.value_or(std::vector<int64_t>{128, 128});
        if (!block_fits(b)) {
            throw Error(where + ": its block scale " + w.scale + " is " + got + ", expected " + (experts > 1 ? std::to_string(experts) + " x " : "") +
                        "[" + std::to_string(ceil_div(out, b[0])) + ", " + std::to_string(ceil_div(cols, b[1])) + "] for blocks " +
                        std::to_string(b[0]) + "x" + std::to_string(b[1]));
        }
        w.scheme = Scheme::block128;
        w.q.scaling = Scaling::block(b[0], b[1]);
    } else if (n == 1) {
        w.scheme = Scheme::tensor;
        w.q.scaling = Scaling::tensor();
    } else if (cfg.strategy.empty() && cfg.block && block_fits(*cfg.block)) {
        w.scheme = Scheme::block128;  // a block-scaled weight among other schemes
        w.q.scaling = Scaling::block((*cfg.block)[0], (*cfg.block)[1]);
    } else if (n == experts && experts > 1) {
        w.scheme = Scheme::tensor;  // one scale per expert: a block of [out, in] in the matrix view
        w.q.scaling = Scaling::block(out, cols);
    } else if (n == rows && s.size(0) == (experts > 1 ? experts : rows)) {
        w.scheme = Scheme::channel;  // [out], [out, 1] (compressed-tensors, fbgemm_fp8), [E, out, 1]
        w.q.scaling = Scaling::row();
    } else if (n % rows == 0 && cols % (n / rows) == 0 && (!cfg.group_size || *cfg.group_size == cols / (n / rows))) {
        w.scheme = Scheme::group;  // compressed-tensors' group strategy: [out, in / group_size]
        w.q.scaling = Scaling::block(1, cols / (n / rows));
    } else {
        throw Error(where + ": its scale " + w.scale + " " + got +
                    " fits no layout (f32/bf16/f16 [1], [out, 1], [out, in/group], the block grid; e8m0 [out, ceil(in/32)])" +
                    (t.quantization_config() ? std::string()
                                             : std::string("; there is no quantization_config (neither in the file's metadata "
                                                           "nor in a config.json beside it): a compressed-tensors block or "
                                                           "group scale is known only from the checkpoint's config.json")));
    }
    if (!cfg.strategy.empty() && cfg.strategy != "block" && cfg.strategy != to_string(w.scheme)) {
        throw Error(where + ": quantization_config says strategy '" + cfg.strategy + "' but its scale " + w.scale + " (" + got + ") is " +
                    std::string(to_string(w.scheme)));
    }
    const GroupShape gs = w.q.scaling.scale_shape(rows, cols);
    w.q.scale_inv = s.contiguous().reshape({gs.rows, gs.cols});
    w.q.data = data.reshape({rows, cols});
    w.shape = data.shape();
    if (const std::string is = input_scale_name(name); !is.empty() && t.contains(is)) w.input_scale = is;
    return w;
}

bool is_scale_name(const TensorLookup& t, const std::string& name) {
    for (const std::string_view suffix : {"_scale_inv", "_scale"}) {
        if (name.size() > suffix.size() && std::string_view(name).substr(name.size() - suffix.size()) == suffix) {
            const std::string w = name.substr(0, name.size() - suffix.size());
            if (t.contains(w) && stored_weight(t, w)) return true;
        }
    }
    // A static activation scale (compressed-tensors' input_scale) beside an FP8 weight.
    const std::string_view in = ".input_scale";
    if (name.size() > in.size() && std::string_view(name).substr(name.size() - in.size()) == in) {
        const std::string w = name.substr(0, name.size() - in.size()) + ".weight";
        if (t.contains(w) && stored_weight(t, w)) return true;
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

void PolicyLayer::set_recipe(std::string_view recipe) {
    quantize_input = recipe != "weight_only";
    try {
        scheme = scheme_of_recipe(quantize_input ? recipe : "rowwise");
    } catch (const Error&) {
        throw Error("unknown recipe '" + std::string(recipe) + "', expected tensorwise, rowwise, block, mxfp8 or weight_only");
    }
}

std::string_view PolicyLayer::recipe() const {
    return !scheme ? std::string_view() : quantize_input ? recipe_of(*scheme) : std::string_view("weight_only");
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
                pl.set_recipe(l["recipe"].get<std::string>());
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
        o["recipe"] = l.scheme ? Json(l.recipe()) : Json(nullptr);
        o["reason"] = l.reason;
        layers.push_back(std::move(o));
    }
    return Json{{"format", "fp8kit-policy"}, {"version", 1}, {"layers", std::move(layers)}}.dump(2) + "\n";
}

void write_policy(const std::string& path, const Policy& p) {
    const std::string text = policy_json(p);
    platform::ReplacingFile f(path);
    f.write(text.data(), text.size());
    f.commit();
}

}  // namespace fp8kit
