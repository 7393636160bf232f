// tools/quantize.cpp: `fp8kit quantize IN OUT [--scheme S] [--layout L] [--format F] [--skip REGEX...]
// [--policy FILE] [--keep-nonfinite] [--force] [--quiet] [--json]` - quantizes the 2-D floating
// weights of a safetensors checkpoint (a file or a directory of shards) to FP8 and writes the
// quantization_config a loader parses (in the metadata, and config.json for a directory):
//   compressed-tensors  quant_method compressed-tensors, format float-quantized (mx32: its MXFP8,
//                       mxfp8-quantized), one config group per scheme with its modules as
//                       targets, `ignore` the kept modules; W_scale in the weight's dtype ([1],
//                       [out, 1] or the 128x128 block grid; mx32: the e8m0 codes as U8)
//   hf-fp8              transformers' FineGrainedFP8 / DeepSeek-V3: quant_method fp8,
//                       weight_block_size [128, 128], W_scale_inv, modules_to_not_convert
//   fp8kit              any scheme and format, quant_method fp8kit (what no other loader reads:
//                       e5m2, and any shape)
// auto picks hf-fp8 for block128, compressed-tensors for tensor / channel / mx32, fp8kit for e5m2.
// Before any work: the options, OUT (never IN, compared as files; an existing OUT only with
// --force), IN's weights (FP8 ones refused: IN must be high precision; NaN / Inf refused naming
// tensor and index, or with --keep-nonfinite kept in high precision and listed). A run that
// quantizes nothing writes no quantization_config. OUT appears whole or not at all.
// Checked by tests/e2e/test_checkpoint.sh (layouts, SQNR, PyTorch reading them),
// tests/e2e/test_checkpoint_safety.sh (outputs, interrupts, non-finite weights) and
// tests/python/test_checkpoint_ecosystem.py (transformers and compressed-tensors load the output).
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint_commands.hpp"
#include "commands.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "fp8kit/format.hpp"

namespace fp8kit::tools {

namespace {

using Json = nlohmann::ordered_json;

struct QuantizeArgs {
    std::string in, out, scheme = "block128", layout = "auto", format = "e4m3fn", policy;
    std::vector<std::string> skip;
    bool keep_nonfinite = false;
    OutputArgs o;
};

enum class Layout { compressed_tensors, hf_fp8, fp8kit };

struct Row {
    std::string name;
    Scheme scheme;
    size_t before, after;
    double sqnr;
};

Layout parse_layout(const std::string& s) {
    if (s == "compressed-tensors") return Layout::compressed_tensors;
    if (s == "hf-fp8") return Layout::hf_fp8;
    if (s == "fp8kit") return Layout::fp8kit;
    throw Error("--layout " + s + ": expected auto, compressed-tensors, hf-fp8 or fp8kit");
}

// The scale tensor's name in a layout: DeepSeek's W_scale_inv for hf-fp8 (and fp8kit's block128),
// compressed-tensors' W_scale for every strategy.
std::string layout_scale_name(const std::string& weight, Scheme s, Layout l) {
    return l == Layout::compressed_tensors ? weight + "_scale" : scale_name(weight, s);
}

// compressed-tensors' QuantizationArgs for FP8 weights / dynamic activations (the fields of its
// FP8_DYNAMIC and FP8_BLOCK presets; the model forbids any other key).
Json ct_args(const std::string& strategy, bool dynamic) {
    return {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"group_size", nullptr},
              {"strategy", strategy}, {"block_structure", nullptr}, {"dynamic", dynamic}, {"actorder", nullptr},
              {"observer", nullptr}, {"observer_kwargs", Json::object()}};
}

// compressed-tensors' MXFP8 arguments (its MXFP8 preset): groups of 32 whose uint8 scale_dtype
// makes their scales e8m0 codes.
Json ct_mx_args(bool dynamic) {
    Json a = ct_args("group", dynamic);
    a["group_size"] = 32;
    a["scale_dtype"] = "torch.uint8";
    return a;
}

// compressed-tensors keeps scales in the weight's dtype (a bf16 model has bf16 weight_scale
// parameters, which transformers loads a f32 scale into, rounding it): so the file holds them so,
// and every reader - fp8kit, transformers, vLLM - dequantizes with the same numbers. The codes
// were chosen for the f32 scale; its bf16 rounding (relative error < 2^-8) moves each dequantized
// value by as much, ~48 dB below the signal, under FP8's own ~31 dB: verify measures the sum.
Tensor in_weight_dtype(const Tensor& scale_f32, DType weight) {
    if (weight == DType::f32) return scale_f32;
    const Tensor c = scale_f32.contiguous();
    Tensor out = Tensor::empty(c.shape(), weight);
    for (int64_t i = 0; i < c.numel(); ++i) {
        if (weight == DType::bf16) out.data<bf16>()[i] = bf16(c.data<const float>()[i]);
        else out.data<f16>()[i] = f16(c.data<const float>()[i]);
    }
    return out;
}

// A kept module as transformers' modules_to_not_convert names it (should_convert_module: a pattern
// keeps every module it matches as a regular expression from the start, or that ends with it):
// the name itself, unless that would also keep a quantized module (Diffusers' Flux keeps its final
// proj_out, whose 16 rows are no whole block, and quantizes single_transformer_blocks.N.proj_out),
// then the name escaped and anchored, "proj_out$", which matches it alone.
std::string transformers_pattern(const std::string& module, const std::map<std::string, Scheme>& plan) {
    bool ambiguous = false;
    for (const auto& [weight, scheme] : plan) {
        const std::string q = module_name(weight);
        ambiguous = ambiguous || q.starts_with(module) || q.ends_with(module);
    }
    if (!ambiguous) return module;
    std::string out;
    for (const char c : module) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
        out += c;
    }
    return out + "$";
}

// e8m0 scales as compressed-tensors' MXFP8 stores them: the same bytes, dtype U8.
Tensor as_u8(const Tensor& e8m0) {
    const auto keep = std::make_shared<const Tensor>(e8m0.contiguous());
    return Tensor::view_of(keep, keep->data<const uint8_t>(), keep->shape(), DType::u8);
}

std::string quantization_config(Layout layout, Format format, const std::map<std::string, Scheme>& plan,
                                 const std::vector<std::string>& kept) {
    Json ignore = Json::array();
    for (const std::string& k : kept) ignore.push_back(layout == Layout::hf_fp8 ? transformers_pattern(module_name(k), plan) : module_name(k));
    if (layout == Layout::hf_fp8) {
        return Json{{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}},
                    {"modules_to_not_convert", ignore}}.dump();
    }
    if (layout == Layout::compressed_tensors) {
        std::map<Scheme, Json> targets;
        for (const auto& [name, scheme] : plan) targets[scheme].push_back(module_name(name));
        Json groups = Json::object();
        std::set<std::string> formats;
        for (auto& [scheme, t] : targets) {
            const bool mx = scheme == Scheme::mx32;
            Json w = mx ? ct_mx_args(false) : ct_args(scheme == Scheme::block128 ? "block" : std::string(to_string(scheme)), false);
            Json in = mx ? ct_mx_args(true) : ct_args(scheme == Scheme::block128 ? "group" : "token", true);
            if (scheme == Scheme::block128) {
                w["block_structure"] = {128, 128};
                in["group_size"] = 128;
            }
            const char* format_name = mx ? "mxfp8-quantized" : "float-quantized";
            formats.insert(format_name);
            groups["group_" + std::to_string(groups.size())] = {{"targets", std::move(t)}, {"weights", std::move(w)},
                                                                 {"input_activations", std::move(in)},
                                                                 {"output_activations", nullptr}, {"format", format_name}};
        }
        return Json{{"quant_method", "compressed-tensors"}, {"format", formats.size() == 1 ? *formats.begin() : "mixed-precision"},
                    {"quantization_status", "compressed"},
                    {"config_groups", std::move(groups)}, {"ignore", ignore}, {"kv_cache_scheme", nullptr},
                    {"global_compression_ratio", nullptr}, {"sparsity_config", Json::object()}}.dump();
    }
    std::map<std::string, std::string> schemes;
    bool any_block = false;
    for (const auto& [name, scheme] : plan) {
        schemes[module_name(name)] = to_string(scheme);
        any_block = any_block || scheme == Scheme::block128;
    }
    Json q = {{"quant_method", "fp8kit"}, {"fmt", format == Format::e4m3fn ? "e4m3" : "e5m2"}, {"activation_scheme", "dynamic"}};
    if (any_block) q["weight_block_size"] = {128, 128};
    q["schemes"] = schemes;
    q["modules_to_not_convert"] = ignore;
    return q.dump();
}

void run_quantize(const QuantizeArgs& a) {
    // The options first (usage errors, exit 2).
    const Format format = parse_format(a.format);
    if (format != Format::e4m3fn && format != Format::e5m2) throw Error("--format " + a.format + ": expected e4m3fn or e5m2");
    const Scheme default_scheme = parse_scheme(a.scheme);
    std::optional<Layout> layout = a.layout == "auto" ? std::nullopt : std::optional<Layout>(parse_layout(a.layout));
    const SkipRule skip(a.skip);
    std::optional<Policy> policy;
    if (!a.policy.empty()) reading_inputs([&] { policy = read_policy(a.policy); });

    std::unique_ptr<Checkpoint> in;
    reading_inputs([&] { in = std::make_unique<Checkpoint>(a.in); });
    prepare_output(a.out, in->is_directory(), in->files(), a.o);

    // Which tensors become FP8, with which scheme - decided, and IN checked, before writing anything.
    std::map<std::string, Scheme> plan;
    std::vector<std::string> kept, notes;
    std::vector<std::string> fp8_inputs, non_finite;
    reading_inputs([&] {
        for (const std::string& name : in->names()) {
            const SafetensorsEntry& e = in->entry(name);
            if (is_fp8(e.dtype) && e.dtype != DType::e8m0fnu && e.shape.size() >= 2) fp8_inputs.push_back(name);
            if (e.shape.size() != 2 || !is_float_weight(e.dtype)) continue;
            std::optional<Scheme> scheme = default_scheme;
            if (policy) {
                if (const PolicyLayer* l = policy->find(name, e.shape)) scheme = l->fp8 ? l->scheme : std::nullopt;
            }
            if (skip.skips(name) || !scheme) {
                kept.push_back(name);
                continue;
            }
            if (const auto bad = find_non_finite(to_f32(in->tensor(name)))) {
                const std::string what = quote_printable(name) + " has " + bad->kind + " at " + bad->index +
                                         (bad->count > 1 ? " (" + std::to_string(bad->count) + " non-finite values)" : "");
                if (!a.keep_nonfinite) {
                    non_finite.push_back(what);
                    continue;
                }
                notes.push_back("kept in high precision (--keep-nonfinite): " + what);
                kept.push_back(name);
                continue;
            }
            plan.emplace(name, *scheme);
        }
        if (!fp8_inputs.empty()) {
            throw Error(a.in + " holds FP8 weights already (" + quote_printable(fp8_inputs.front()) + (fp8_inputs.size() > 1 ? ", ..." : "") +
                        "): quantize reads high-precision weights, refused rather than relabelled; `fp8kit dequantize` it first");
        }
        if (!non_finite.empty()) {
            std::string msg = a.in + ": non-finite weights, refused (--keep-nonfinite keeps such tensors in high precision):";
            for (const std::string& w : non_finite) msg += "\n  " + w;
            throw Error(msg);
        }
    });
    // The layout: what loaders of each accept.
    bool all_block = !plan.empty();
    for (const auto& [_, s] : plan) all_block = all_block && s == Scheme::block128;
    if (!layout) layout = format != Format::e4m3fn ? Layout::fp8kit : all_block ? Layout::hf_fp8 : Layout::compressed_tensors;
    if (*layout != Layout::fp8kit && format != Format::e4m3fn) throw Error("--layout " + a.layout + " stores e4m3fn only; --format e5m2 needs --layout fp8kit");
    if (*layout == Layout::hf_fp8 && !plan.empty() && !all_block)
        throw Error("--layout hf-fp8 (transformers FineGrainedFP8) stores 128x128 blocks only: use --scheme block128");
    if (*layout != Layout::fp8kit) {
        // Block loaders (transformers' FP8Linear, vLLM) need whole 128x128 blocks; compressed-tensors'
        // MXFP8 whole groups of 32 along a row.
        for (auto it = plan.begin(); it != plan.end();) {
            const Shape& sh = in->entry(it->first).shape;
            const bool block = it->second == Scheme::block128 && (sh[0] % 128 != 0 || sh[1] % 128 != 0);
            if (block || (it->second == Scheme::mx32 && sh[1] % 32 != 0)) {
                notes.push_back("kept in high precision: " + quote_printable(it->first) + " " + to_string(sh) +
                                (block ? " is not whole 128x128 blocks, which block loaders need"
                                       : " is not whole groups of 32 along its rows, which compressed-tensors' MXFP8 needs"));
                kept.push_back(it->first);
                it = plan.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (const auto& [name, scheme] : plan) {
        const std::string sn = layout_scale_name(name, scheme, *layout);
        if (in->contains(sn))
            throw BadInput(a.in + ": tensor " + quote_printable(sn) + " exists already; it would collide with the scale of " + quote_printable(name));
    }
    if (!a.o.quiet)
        for (const std::string& n : notes) std::cerr << "fp8kit: " << n << "\n";
    const std::optional<std::string> qc =
        plan.empty() ? std::nullopt : std::optional<std::string>(quantization_config(*layout, format, plan, kept));
    if (plan.empty() && !a.o.quiet) std::cerr << "fp8kit: no weight to quantize: OUT is IN's tensors without a quantization_config\n";

    std::vector<Row> rows;
    reading_inputs([&] {
        std::unique_ptr<CheckpointWriter> writer;
        writing_output([&] { writer = std::make_unique<CheckpointWriter>(*in, a.out, qc); });
        const Progress progress(a.o.quiet || a.o.json);
        size_t done = 0;
        for (size_t s = 0; s < in->shard_files().size(); ++s) {
            std::vector<std::pair<std::string, Tensor>> out;
            for (const std::string& name : in->shard(s).names()) {
                const Tensor t = in->shard(s).tensor(name);
                const auto it = plan.find(name);
                if (it == plan.end()) {
                    out.emplace_back(name, t);
                    continue;
                }
                progress(done, plan.size(), name);
                const Scheme scheme = it->second;
                QuantizeOptions opts;
                opts.format = format;
                opts.scaling = scaling_of(scheme);
                const QTensor q = quantize(t, opts);
                // The layout's scale shape: [1] per tensor, [out, 1] per channel, the groups otherwise.
                Tensor scale = scheme == Scheme::tensor ? q.scale_inv.reshape({1}) : q.scale_inv;
                if (*layout == Layout::compressed_tensors) scale = scheme == Scheme::mx32 ? as_u8(scale) : in_weight_dtype(scale, t.dtype());
                out.emplace_back(name, q.data);
                out.emplace_back(layout_scale_name(name, scheme, *layout), scale);
                rows.push_back({name, scheme, t.nbytes(), q.data.nbytes() + scale.nbytes(),
                                compare(to_f32(t), dequantize(q, DType::f32)).sqnr_db});
                ++done;
            }
            writing_output([&] { writer->write_shard(s, out); });
        }
        progress(done, plan.size(), "");
        writing_output([&] { writer->commit(); });
    });

    size_t before = 0, after = 0;
    for (const Row& r : rows) {
        before += r.before;
        after += r.after;
    }
    if (a.o.json) {
        Json t = Json::array();
        for (const Row& r : rows)
            t.push_back({{"name", r.name}, {"scheme", to_string(r.scheme)}, {"bytes_before", r.before},
                         {"bytes_after", r.after}, {"sqnr_db", r.sqnr}});
        Json k = Json::array();
        for (const std::string& n : kept) k.push_back(n);
        std::printf("%s\n", Json{{"out", a.out}, {"quantized", std::move(t)}, {"kept", std::move(k)},
                                 {"bytes_before", before}, {"bytes_after", after},
                                 {"quantization_config", qc ? Json::parse(*qc) : Json(nullptr)}}.dump().c_str());
        return;
    }
    std::printf("%-48s %-9s %14s %14s %9s\n", "tensor", "scheme", "bytes before", "bytes after", "SQNR dB");
    for (const Row& r : rows) {
        std::printf("%-48s %-9s %14zu %14zu %9.2f\n", printable(r.name).c_str(), std::string(to_string(r.scheme)).c_str(), r.before,
                    r.after, r.sqnr);
    }
    std::printf("%-48s %-9s %14zu %14zu\n", "total (quantized tensors)", "", before, after);
    std::printf("kept in high precision: %zu 2-D tensors%s\n", kept.size(), kept.empty() ? "" : " (skip rules, policy or notes above)");
}

}  // namespace

void add_quantize_command(CLI::App& app) {
    auto a = std::make_shared<QuantizeArgs>();
    CLI::App* c = app.add_subcommand("quantize", "quantize a safetensors checkpoint's weights to FP8 (file or shard directory)");
    c->add_option("IN", a->in, "input .safetensors file or directory of shards (only read)")->required()->check(not_empty);
    c->add_option("OUT", a->out, "output file or directory (never IN; an existing one only with --force)")->required()->check(not_empty);
    c->add_option("--scheme", a->scheme, "tensor (W_scale [1]), channel (W_scale [out,1]), block128 (128x128 blocks), mx32 (e8m0 per 1x32)")
        ->capture_default_str();
    c->add_option("--layout", a->layout,
                  "auto, compressed-tensors (vLLM, transformers), hf-fp8 (transformers FineGrainedFP8 / DeepSeek-V3: block128), "
                  "fp8kit (any scheme, read by fp8kit only)")
        ->capture_default_str();
    c->add_option("--format", a->format, "e4m3fn or e5m2 (e5m2: --layout fp8kit)")->capture_default_str();
    c->add_option("--skip", a->skip, "regular expressions of tensor names to keep in high precision (besides embeddings, norms, lm_head, MoE routers)");
    c->add_option("--policy", a->policy, "per-layer policy JSON (docs/CHECKPOINTS.md), e.g. from fp8kit advise")->check(not_empty);
    c->add_flag("--keep-nonfinite", a->keep_nonfinite, "keep weights holding NaN or Inf in high precision (listed) instead of refusing");
    add_output_flags(c, a->o, true);
    c->footer(std::string("Examples:\n  fp8kit quantize model/ model-fp8/ --scheme channel           # compressed-tensors, for vLLM / transformers\n"
                          "  fp8kit quantize model/ model-fp8/ --scheme block128 --force   # DeepSeek-V3 layout, replacing model-fp8/\n"
                          "  fp8kit quantize m.safetensors q.safetensors --json\n") + exit_codes_help);
    c->callback([a] { run_quantize(*a); });
}

}  // namespace fp8kit::tools
