// src/io/checkpoint.cpp: FP8 weight layouts (recognising a stored FP8 weight and its scale as a
// QTensor) and the conversion policy file (fp8kit/checkpoint.hpp).
// Checked by tests/e2e/test_checkpoint.sh (through the fp8kit command, against PyTorch),
// tests/nn/test_parameters.cpp (FP8 checkpoints loaded into a model) and tests/nn/test_model_conversion.cpp
// (policies read and applied).
#include "fp8kit/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "io/json.hpp"
#include "platform/platform.hpp"

namespace fp8kit {

namespace {

using detail::Json;
using detail::shown;

// a / b rounded up, for a >= 0 and b >= 1 - with no overflow where b is near INT64_MAX (a
// quantization_config's block size is the file's to choose).
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

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
    throw Error("unknown scheme " + quote_printable(text) + ", expected tensor, channel, block128 or mx32");
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
    throw Error("policy: unknown recipe " + quote_printable(recipe) + ", expected tensorwise, rowwise, block or mxfp8");
}

namespace {

// What quantization_config says about the weights' scales, in any of the producers' dialects:
// transformers FineGrainedFP8 / DeepSeek-V3 (quant_method fp8, weight_block_size),
// compressed-tensors (config_groups.*: targets, weights.strategy, block_structure, group_size),
// fp8kit (schemes per module), fbgemm_fp8 (rows). Strategies are fp8kit's scheme names.
struct ConfigScales {
    bool present = false;                       // a quantization_config describes the tensors
    std::optional<std::vector<int64_t>> block;  // [rows, cols]
    std::optional<int64_t> group_size;
    bool mx_u8 = false;  // compressed-tensors' MXFP8: e8m0 scales stored as their uint8 codes
    std::string strategy;                              // every module's, or "" when not said (or mixed)
    std::map<std::string, std::string> module_strategy;  // a module's own, where the config names it
    // The scheme the config says a weight's module is stored in, or "" when it does not say: the
    // module of "m.weight", or a 3-D experts parameter ("m.experts.down_proj") by its own name.
    std::string strategy_of(const std::string& weight) const {
        auto it = module_strategy.find(module_name_of(weight));
        if (it == module_strategy.end()) it = module_strategy.find(weight);
        return it != module_strategy.end() ? it->second : strategy;
    }
    static std::string module_name_of(const std::string& weight) {
        const size_t dot = weight.rfind('.');
        return dot == std::string::npos ? weight : weight.substr(0, dot);
    }
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
    if (b.size() != 2 || b.size() != v.size())
        throw Error(path + ": quantization_config " + what + " " + shown(v) + " is not [rows, cols] of positive integers");
    return b;
}

// compressed-tensors' strategy names as fp8kit's schemes ("" for one that stores no weight scale
// fp8kit reads, e.g. token).
std::string scheme_of_strategy(const std::string& st) {
    if (st == "block") return std::string(to_string(Scheme::block128));
    return st == "tensor" || st == "channel" || st == "group" ? st : "";
}

// compressed-tensors' storage formats of FP8 codes (its CompressionFormat): float-quantized and
// naive-quantized store them as they are, mxfp8-quantized with its e8m0 scales as uint8 codes, and
// mixed-precision defers to each group's own. Any other (pack-quantized, int-quantized, the
// sparse and FP4 ones) stores something else than the FP8 tensors beside it.
void check_format(const Json& f, const std::string& where, bool top) {
    if (f.is_null()) return;
    if (f.is_string()) {
        const std::string v = f.get<std::string>();
        if (v == "float-quantized" || v == "naive-quantized" || v == "mxfp8-quantized" || (top && v == "mixed-precision")) return;
    }
    throw Error(where + " format " + shown(f) + " is not a format of FP8 codes (float-quantized, naive-quantized, mxfp8-quantized" +
                (top ? ", mixed-precision" : "") + "), but the checkpoint stores FP8 tensors");
}

// Whether compressed-tensors' weight arguments are MX (its should_generate_mx_scales: 8-bit floats
// in groups of 32 with uint8 scales, the e8m0 codes), or its group's format says mxfp8-quantized.
bool is_mx_group(const Json& w, const Json& format) {
    return (format.is_string() && format == "mxfp8-quantized") ||
           (w.contains("scale_dtype") && w["scale_dtype"] == "torch.uint8" && w.contains("group_size") && w["group_size"] == 32);
}

ConfigScales read_config_scales(const TensorLookup& t, const std::string& text) {
    const std::string from = t.quantization_config_where();
    ConfigScales c;
    c.present = true;
    const Json q = detail::parse_json(text, from + ": quantization_config");
    if (!q.is_object()) throw Error(from + ": quantization_config is not a JSON object");
    if (q.contains("weight_block_size")) c.block = block_field(q["weight_block_size"], "weight_block_size", from);
    const std::string method = q.contains("quant_method") && q["quant_method"].is_string() ? q["quant_method"].get<std::string>() : "";
    if (method == "fp8" && c.block) c.strategy = to_string(Scheme::block128);  // FineGrainedFP8: blocks only
    if (method == "fp8kit" && q.contains("schemes")) {
        if (!q["schemes"].is_object()) throw Error(from + ": quantization_config schemes is not an object of module: scheme");
        // group (a weight read from compressed-tensors' group strategy): its size is the config's group_size.
        if (q.contains("group_size")) {
            if (!q["group_size"].is_number_integer() || q["group_size"].get<int64_t>() < 1)
                throw Error(from + ": quantization_config group_size " + shown(q["group_size"]) + " is not a positive integer");
            c.group_size = q["group_size"].get<int64_t>();
        }
        for (const auto& [module, scheme] : q["schemes"].items()) {
            if (!scheme.is_string()) throw Error(from + ": quantization_config schemes[" + quote_printable(module) + "] is not a scheme name");
            if (scheme == "group" && c.group_size) {
                c.module_strategy[module] = "group";
                continue;
            }
            try {
                c.module_strategy[module] = to_string(parse_scheme(scheme.get<std::string>()));
            } catch (const Error&) {
                throw Error(from + ": quantization_config schemes[" + quote_printable(module) + "] is " + quote_printable(scheme.get<std::string>()) +
                            ", expected tensor, channel, block128, mx32, or group with a group_size");
            }
        }
    }
    if (q.contains("config_groups")) {
        // Several groups (mixed schemes): a module a group's targets name takes its strategy;
        // the others are told apart by their scales' shapes, unless every group has the same
        // strategy. The first block and group size named are the ones shapes are checked against.
        // A group whose weights are not FP8 (num_bits, type) or whose strategy fp8kit does not
        // know contradicts the FP8 tensors: refused, not read past.
        if (!q["config_groups"].is_object()) throw Error(from + ": quantization_config config_groups is not an object of name: group");
        const Json top_format = q.contains("format") ? q["format"] : Json();
        check_format(top_format, from + ": quantization_config", true);
        bool mixed = false, first = true;
        for (const auto& [name, g] : q["config_groups"].items()) {
            const std::string where = from + ": quantization_config config_groups[" + quote_printable(name) + "]";
            if (!g.is_object()) throw Error(where + " is not an object");
            for (const char* part : {"weights", "input_activations"}) {
                if (g.contains(part) && !g[part].is_object() && !g[part].is_null()) throw Error(where + "." + part + " is not an object");
            }
            if (!g.contains("weights") || g["weights"].is_null()) continue;
            const Json& w = g["weights"];
            if ((w.contains("num_bits") && w["num_bits"] != 8) || (w.contains("type") && w["type"] != "float")) {
                throw Error(where + ".weights are " + shown(w) + ": not FP8 (num_bits 8, type float), the layouts fp8kit reads");
            }
            if (w.contains("strategy") && !w["strategy"].is_null() &&
                (!w["strategy"].is_string() || scheme_of_strategy(w["strategy"].get<std::string>()).empty())) {
                throw Error(where + ".weights strategy " + shown(w["strategy"]) + ", expected tensor, channel, group or block");
            }
            const Json format = g.contains("format") && !g["format"].is_null() ? g["format"] : top_format;
            check_format(g.contains("format") ? g["format"] : Json(), where, false);
            const bool mx = is_mx_group(w, format);
            if (mx && (!w.contains("group_size") || w["group_size"] != 32 || w.value("strategy", Json()) != "group")) {
                throw Error(where + ".weights are " + shown(w) + ": MXFP8 (mxfp8-quantized) scales groups of 32 (strategy group, group_size 32)");
            }
            c.mx_u8 = c.mx_u8 || mx;
            const std::string st = mx ? std::string(to_string(Scheme::mx32))
                                      : scheme_of_strategy(w.contains("strategy") && w["strategy"].is_string() ? w["strategy"].get<std::string>() : "");
            if (first) c.strategy = st;
            mixed = mixed || st != c.strategy;
            first = false;
            if (g.contains("targets")) {  // compressed-tensors: a list of names (or "re:" patterns)
                const Json& targets = g["targets"];
                const bool names = targets.is_array() &&
                                   std::all_of(targets.begin(), targets.end(), [](const Json& n) { return n.is_string(); });
                if (!names) throw Error(where + ".targets is " + shown(targets) + ", expected a list of module names");
                for (const Json& target : targets)
                    if (!st.empty()) c.module_strategy.emplace(target.get<std::string>(), st);
            }
            if (!c.block && w.contains("block_structure")) c.block = block_field(w["block_structure"], "block_structure", from);
            if (!c.group_size && w.contains("group_size") && w["group_size"].is_number_integer() && w["group_size"].get<int64_t>() > 0)
                c.group_size = w["group_size"].get<int64_t>();
        }
        if (mixed) c.strategy.clear();
    }
    return c;
}

// What t's quantization_config says, read once for a run of lookups: every stored weight asks, and
// a config of megabytes (a long modules_to_not_convert) parsed for each made loading quadratic.
// The last one read is kept, per thread, with the file and text it was read from.
ConfigScales config_scales(const TensorLookup& t) {
    const auto text = t.quantization_config();
    if (!text) return {};
    thread_local std::string last_path, last_text;
    thread_local ConfigScales last;
    if (*text != last_text || t.quantization_config_where() != last_path) {
        last = read_config_scales(t, *text);
        last_path = t.quantization_config_where();
        last_text = *text;
    }
    return last;
}

// A scale tensor's values as float32 (f32, bf16 and f16 convert exactly), or as it is (e8m0);
// fp8kit::Error (`where` and the rule) for any other dtype, and for a value that is not finite
// and positive (e8m0: its NaN code 0xff) - a zero, negative or non-finite scale would write zero,
// sign-flipped or non-finite weights - or whose product with `largest`, the largest magnitude of
// the codes it scales, is not a float32: those codes would dequantize to Inf.
Tensor checked_scale(const Tensor& raw, const std::string& where, float largest) {
    const DType d = raw.dtype();
    if (d != DType::f32 && d != DType::bf16 && d != DType::f16 && d != DType::e8m0fnu) {
        throw Error(where + " is " + std::string(to_string(d)) + " " + to_string(raw.shape()) +
                    ": a scale is f32, bf16, f16 or e8m0 (docs/CHECKPOINTS.md)");
    }
    const Tensor c = raw.contiguous();
    const int64_t n = c.numel();
    Tensor out = d == DType::f32 || d == DType::e8m0fnu ? c : Tensor::empty(c.shape(), DType::f32);
    for (int64_t i = 0; i < n; ++i) {
        float v = 0;
        switch (d) {
            case DType::bf16: v = out.data<float>()[i] = float(c.data<const bf16>()[i]); break;
            case DType::f16: v = out.data<float>()[i] = float(c.data<const f16>()[i]); break;
            case DType::e8m0fnu: v = decode(c.data<const uint8_t>()[i], Format::e8m0fnu); break;
            default: v = c.data<const float>()[i];
        }
        const bool overflows = std::isfinite(v) && double(v) * double(largest) > double(std::numeric_limits<float>::max());
        if (std::isfinite(v) && v > 0 && !overflows) continue;
        std::vector<int64_t> at(size_t(c.dim()));
        for (int64_t k = c.dim() - 1, r = i; k >= 0; --k) {
            at[size_t(k)] = r % c.size(k);
            r /= c.size(k);
        }
        char value[32];
        std::snprintf(value, sizeof value, "%g", double(v));
        if (overflows) {
            char times[32];
            std::snprintf(times, sizeof times, "%g", double(largest));
            throw Error(where + " holds " + value + " at " + to_string(at) + ": times the codes' largest magnitude (" + times +
                        ") that is beyond float32, so its weights would dequantize to Inf (docs/CHECKPOINTS.md)");
        }
        throw Error(where + " holds " + value + " at " + to_string(at) + ": a scale is finite and positive (docs/CHECKPOINTS.md)");
    }
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
    const std::string where = t.path() + ": FP8 tensor " + quote_printable(name) + " " + to_string(data.shape());
    if (data.dim() > 3) throw Error(where + " has more than 3 dimensions");
    // A 3-D tensor [experts, out, in] (MoE experts) is the matrix [experts * out, in]; its scales
    // are per expert, per expert and channel, or per expert and block.
    const int64_t experts = data.dim() == 3 ? data.size(0) : 1, out = data.size(-2), cols = data.size(-1);
    const int64_t rows = experts * out;
    const ConfigScales cfg = config_scales(t);
    StoredWeight w{Scheme::tensor, "", QTensor{}, {}, ""};
    const bool inv = t.contains(name + "_scale_inv");
    const std::string comfy = comfy_scale_name(name);
    if (!inv && !t.contains(name + "_scale") && !t.contains(comfy)) {
        if (!cfg.present) return std::nullopt;  // FP8 codes without a scale, in a file that claims no quantization
        throw Error(where + " has no scale tensor (" + quote_printable(name + "_scale") + " or " + quote_printable(name + "_scale_inv") +
                    "), and the quantization_config says the checkpoint is quantized: every FP8 weight needs its scale");
    }
    w.scale = inv ? name + "_scale_inv" : t.contains(name + "_scale") ? name + "_scale" : comfy;
    // One scale per weight: which of two its producer meant is not for fp8kit to guess.
    for (const std::string& other : {name + "_scale_inv", name + "_scale", comfy}) {
        if (other != w.scale && !other.empty() && t.contains(other)) {
            throw Error(where + " has two scales, " + quote_printable(w.scale) + " (the one fp8kit reads) and " + quote_printable(other) +
                        ": which one holds is not for fp8kit to guess");
        }
    }
    Tensor raw = t.tensor(w.scale);
    if (raw.dtype() == DType::u8 && cfg.mx_u8) {  // compressed-tensors' MXFP8: the e8m0 codes as uint8
        const auto keep = std::make_shared<const Tensor>(raw.contiguous());
        raw = Tensor::view_of(keep, keep->data<const uint8_t>(), keep->shape(), DType::e8m0fnu, t.path() + ": " + w.scale);
    }
    const std::string got = std::string(to_string(raw.dtype())) + " " + to_string(raw.shape());
    const float largest = format_info(format_of(data.dtype())).max;
    const Tensor s = checked_scale(raw, where + ": its scale " + quote_printable(w.scale), largest);
    const int64_t n = s.numel();
    const std::vector<int64_t> b = cfg.block.value_or(std::vector<int64_t>{128, 128});
    // Whether the scale is the grid of g_rows x g_cols scales an expert's [out, in] takes, laid out
    // as the matrix's ([experts * g_rows, g_cols]) or per expert ([experts, g_rows, g_cols]): its
    // shape, not only its count - a grid transposed or flattened holds as many values, each for
    // another block.
    const auto grid = [&](int64_t g_rows, int64_t g_cols) {
        return s.shape() == Shape{experts * g_rows, g_cols} || (experts > 1 && s.shape() == Shape{experts, g_rows, g_cols});
    };
    // The scaling a scheme gives this weight when the scale's dtype and shape fit it.
    const auto fits = [&](Scheme scheme) -> std::optional<Scaling> {
        if ((s.dtype() == DType::e8m0fnu) != (scheme == Scheme::mx32)) return std::nullopt;
        switch (scheme) {
            case Scheme::mx32:
                if (grid(out, ceil_div(cols, 32))) return Scaling::mx32();
                break;
            case Scheme::block128:
                if ((experts == 1 || out % b[0] == 0) && grid(ceil_div(out, b[0]), ceil_div(cols, b[1]))) return Scaling::block(b[0], b[1]);
                break;
            case Scheme::tensor:
                if (n == 1) return Scaling::tensor();
                if (n == experts && experts > 1) return Scaling::block(out, cols);  // one scale per expert: a block of [out, in]
                break;
            case Scheme::channel:  // [out], [out, 1] (compressed-tensors, fbgemm_fp8), [E, out, 1]
                if (n == rows && s.dim() >= 1 && s.size(0) == (experts > 1 ? experts : rows)) return Scaling::row();
                break;
            case Scheme::group:  // compressed-tensors' group strategy: [out, in / group_size]
                if (rows > 0 && n >= rows && n % rows == 0 && cols % (n / rows) == 0 && grid(out, n / rows) &&
                    (!cfg.group_size || *cfg.group_size == cols / (n / rows)))
                    return Scaling::block(1, cols / (n / rows));
                break;
        }
        return std::nullopt;
    };
    // What a scheme's scale looks like for this weight, for the messages.
    const auto wanted = [&](Scheme scheme) {
        const std::string e = experts > 1 ? std::to_string(experts) + " x " : "";
        switch (scheme) {
            case Scheme::tensor: return "f32/bf16/f16 [1]" + (experts > 1 ? " or [" + std::to_string(experts) + "]" : std::string());
            case Scheme::channel: return "f32/bf16/f16 [" + std::to_string(rows) + ", 1]";
            case Scheme::group: return "f32/bf16/f16 [" + std::to_string(rows) + ", in / group_size]";
            case Scheme::block128:
                return "f32/bf16/f16 " + e + "[" + std::to_string(ceil_div(out, b[0])) + ", " + std::to_string(ceil_div(cols, b[1])) +
                       "] for blocks " + std::to_string(b[0]) + "x" + std::to_string(b[1]);
            case Scheme::mx32: break;
        }
        return "e8m0 [" + std::to_string(rows) + ", " + std::to_string(ceil_div(cols, 32)) + "]";
    };
    const std::string expected = cfg.strategy_of(name);
    std::optional<Scaling> scaling;
    if (!expected.empty()) {
        // The config names this module's scheme: the scale must be of that scheme's shape.
        w.scheme = expected == "group" ? Scheme::group : parse_scheme(expected);
        scaling = fits(w.scheme);
        if (!scaling) {
            throw Error(where + ": quantization_config says scheme " + quote_printable(expected) + " for it, but its scale " + quote_printable(w.scale) + " is " +
                        got + ", expected " + wanted(w.scheme));
        }
    } else {
        // Recognised from the scale: its dtype (e8m0: mx32), its name (_scale_inv: blocks;
        // ComfyUI's scale_weight: one value - ComfyUI multiplies the weight by it, so [out] values
        // would scale the columns of a square weight, not its rows), then its shape - one value,
        // the config's block grid (among mixed schemes), one per expert, per row, per group.
        const bool e8m0 = s.dtype() == DType::e8m0fnu;
        std::vector<Scheme> order;
        if (e8m0) order = {Scheme::mx32};
        else if (inv) order = {Scheme::block128};
        else if (w.scale == comfy) order = {Scheme::tensor};
        else if (n == 1) order = {Scheme::tensor};
        else order = cfg.block ? std::vector<Scheme>{Scheme::block128, Scheme::tensor, Scheme::channel, Scheme::group}
                               : std::vector<Scheme>{Scheme::tensor, Scheme::channel, Scheme::group};
        for (const Scheme scheme : order) {
            if ((scaling = fits(scheme))) {
                w.scheme = scheme;
                break;
            }
        }
        if (!scaling && w.scale == comfy) {
            throw Error(where + ": its scale " + quote_printable(w.scale) + " is " + got +
                        ", expected one value: ComfyUI multiplies the whole weight by its scale_weight, so fp8kit carries "
                        "one per tensor");
        }
        if (!scaling) {
            throw Error(where + ": its scale " + quote_printable(w.scale) + " " + got + " fits no layout (expected " +
                        (e8m0 || inv ? wanted(order[0])
                                                     : "f32/bf16/f16 [1], [out, 1], [out, in/group], the block grid; e8m0 [out, ceil(in/32)]") +
                        ")" +
                        // A file read alone: the config that names a block or group layout is beside it.
                        (t.quantization_config() ? std::string()
                                                 : std::string("; there is no quantization_config (neither in the file's "
                                                               "metadata nor in a config.json beside it): a compressed-tensors "
                                                               "block or group scale is known only from the checkpoint's config.json")));
        }
    }
    w.q.data = data.reshape({rows, cols});
    w.q.scaling = *scaling;
    const GroupShape gs = w.q.scaling.scale_shape(rows, cols);
    w.q.scale_inv = s.reshape({gs.rows, gs.cols});
    w.shape = data.shape();
    if (const std::string is = input_scale_name(name); !is.empty() && t.contains(is)) {
        w.input_scale = is;
        (void)checked_scale(t.tensor(is), where + ": its static input scale " + quote_printable(is), largest);
    }
    return w;
}

void check_codes_finite(const StoredWeight& w, const std::string& name, const std::string& where) {
    const std::optional<int64_t> at = first_nonfinite_code(w.q.data);
    if (!at) return;
    const int64_t cols = w.q.data.size(1);
    char code[8];
    std::snprintf(code, sizeof code, "0x%02x", unsigned(w.q.data.contiguous().data<const uint8_t>()[*at]));
    throw Error(where + ": " + quote_printable(name) + " holds the code " + code + " (not a number) at row " +
                std::to_string(*at / cols) + ", column " + std::to_string(*at % cols) + " of its [" +
                std::to_string(w.q.data.size(0)) + ", " + std::to_string(cols) +
                "] matrix: every output it reaches would be NaN (a damaged file?)");
}

std::optional<int64_t> first_nonfinite_code(const Tensor& codes) {
    if (!is_fp8(codes.dtype()) || codes.dtype() == DType::e8m0fnu) {
        throw Error("fp8kit::first_nonfinite_code: the codes are " + std::string(to_string(codes.dtype())) +
                    ", expected an FP8 weight format");
    }
    const FormatInfo fi = format_info(format_of(codes.dtype()));
    // Not a number: a magnitude code above the largest finite one (e4m3fn's 0x7f, e5m2's Inf and
    // NaNs), or, in the formats without -0, the code 0x80 (their NaN). Bitwise, not ||: the block
    // loop below then compiles to vector compares (6.9 GB/s on one Zen 3 core, 1.3 with a branch).
    const uint8_t max_code = fi.max_code, fnuz = fi.has_neg_zero ? 0 : 1;
    const auto bad = [max_code, fnuz](uint8_t c) {
        return uint8_t(uint8_t(uint8_t(c & 0x7f) > max_code) | uint8_t(uint8_t(c == 0x80) & fnuz));
    };
    const Tensor c = codes.contiguous();
    const uint8_t* p = c.data<const uint8_t>();
    const int64_t n = c.numel();
    // A block's codes OR-ed (vectorised), the position sought only in a block that holds one: a
    // weight is read at memory speed.
    constexpr int64_t block = 4096;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        const int64_t b1 = std::min(n, b0 + block);
        uint8_t any = 0;
        for (int64_t i = b0; i < b1; ++i) any |= bad(p[i]);
        if (any == 0) continue;
        for (int64_t i = b0; i < b1; ++i)
            if (bad(p[i]) != 0) return i;
    }
    return std::nullopt;
}

std::string comfy_scale_name(const std::string& weight) {
    const std::string_view suffix = ".weight";
    if (weight.size() <= suffix.size() || std::string_view(weight).substr(weight.size() - suffix.size()) != suffix) return {};
    return weight.substr(0, weight.size() - suffix.size()) + ".scale_weight";
}

bool is_scale_name(const TensorLookup& t, const std::string& name) {
    const auto ends = [&name](std::string_view suffix) {
        return name.size() > suffix.size() && std::string_view(name).substr(name.size() - suffix.size()) == suffix;
    };
    const auto beside_fp8 = [&t](const std::string& w) { return t.contains(w) && stored_weight(t, w).has_value(); };
    for (const std::string_view suffix : {"_scale_inv", "_scale"}) {
        if (ends(suffix) && beside_fp8(name.substr(0, name.size() - suffix.size()))) return true;
    }
    // A static activation scale (compressed-tensors' input_scale, ComfyUI's scale_input) or
    // ComfyUI's weight scale, beside an FP8 weight of its module.
    for (const std::string_view suffix : {".input_scale", ".scale_input", ".scale_weight"}) {
        if (ends(suffix) && beside_fp8(name.substr(0, name.size() - suffix.size()) + ".weight")) return true;
    }
    return is_comfy_marker(t, name);
}

bool is_comfy_marker(const TensorLookup& t, const std::string& name) {
    const std::string_view suffix = ".scaled_fp8";
    if (name != suffix.substr(1) && !std::string_view(name).ends_with(suffix)) return false;
    const Tensor m = t.tensor(name);
    return is_fp8(m.dtype()) && m.numel() <= 2;
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
        throw Error("unknown recipe " + quote_printable(recipe) + ", expected tensorwise, rowwise, block, mxfp8 or weight_only");
    }
}

std::string_view PolicyLayer::recipe() const {
    return !scheme ? std::string_view() : quantize_input ? recipe_of(*scheme) : std::string_view("weight_only");
}

Policy read_policy(const std::string& path) {
    Json j;
    {
        const platform::MappedFile f(path);  // names the file when it cannot be read
        j = detail::parse_json(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()), path);
    }
    const auto bad = [&](const std::string& what) { return Error(path + ": " + what + " (see docs/CHECKPOINTS.md)"); };
    // (Fields are type-checked before they are read: nlohmann's value() throws on a mistyped one.)
    if (!j.is_object() || !j.contains("format") || j["format"] != "fp8kit-policy" || !j.contains("layers") || !j["layers"].is_array()) {
        throw bad("not an fp8kit policy: expected {\"format\": \"fp8kit-policy\", \"version\": 1, \"layers\": [...]}");
    }
    if (!j.contains("version") || j["version"] != 1) throw bad("unsupported version " + (j.contains("version") ? shown(j["version"]) : "(none)"));
    Policy p;
    for (const Json& l : j["layers"]) {
        PolicyLayer pl;
        if (!l.is_object() || !l.contains("fp8") || !l["fp8"].is_boolean()) throw bad("layer " + shown(l) + " has no boolean 'fp8'");
        pl.fp8 = l["fp8"].get<bool>();
        if (l.contains("name")) {
            if (!l["name"].is_string()) throw bad("layer " + shown(l) + ": 'name' is not a string");
            pl.name = l["name"].get<std::string>();
        }
        if (l.contains("weight_shape")) {
            const Json& s = l["weight_shape"];
            if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer()) {
                throw bad("layer " + shown(l) + ": 'weight_shape' is not [out, in]");
            }
            pl.weight_shape = {s[0].get<int64_t>(), s[1].get<int64_t>()};
        }
        if (pl.name.empty() == pl.weight_shape.empty()) throw bad("layer " + shown(l) + " needs exactly one of 'name' and 'weight_shape'");
        if (l.contains("recipe") && !l["recipe"].is_null()) {
            if (!l["recipe"].is_string()) throw bad("layer " + shown(l) + ": 'recipe' is not a string");
            try {
                pl.set_recipe(l["recipe"].get<std::string>());
            } catch (const Error& e) {
                throw bad(printable_cut(e.what()));
            }
        }
        if (pl.fp8 && !pl.scheme) throw bad("layer " + shown(l) + " is fp8 but names no recipe");
        if (l.contains("reason") && !l["reason"].is_null()) {
            if (!l["reason"].is_string()) throw bad("layer " + shown(l) + ": 'reason' is not a string");
            pl.reason = l["reason"].get<std::string>();
        }
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
