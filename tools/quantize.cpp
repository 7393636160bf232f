// tools/quantize.cpp: `fp8kit quantize IN OUT [--scheme S] [--format F] [--skip REGEX...]
// [--policy FILE]` - quantizes the 2-D floating weights of a safetensors checkpoint (a file or a
// directory of shards) to FP8 in the community layouts of tools/checkpoint.hpp, with
// quantization_config in the metadata (and config.json). IN is only read; OUT appears whole or
// not at all. Checked by tests/e2e/test_checkpoint.sh (SQNR through dequantize/verify, layouts,
// IN unchanged, no OUT after a failure) and tests/e2e/check_checkpoint.py (PyTorch reads it).
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "checkpoint.hpp"
#include "commands.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/format.hpp"

namespace fp8kit::tools {

namespace {

struct QuantizeArgs {
    std::string in, out, scheme = "block128", format = "e4m3fn", policy;
    std::vector<std::string> skip;
};

struct Row {
    std::string name;
    Scheme scheme;
    size_t before, after;
    double sqnr;
};

void run_quantize(const QuantizeArgs& a) {
    const Format format = parse_format(a.format);
    if (format != Format::e4m3fn && format != Format::e5m2) {
        throw Error("--format " + a.format + ": expected e4m3fn or e5m2");
    }
    const Scheme default_scheme = parse_scheme(a.scheme);
    const SkipRule skip(a.skip);
    const std::optional<Policy> policy = a.policy.empty() ? std::nullopt : std::optional<Policy>(read_policy(a.policy));
    const Checkpoint in(a.in);

    // Which tensors become FP8, with which scheme (decided before writing anything).
    std::map<std::string, Scheme> plan;
    std::vector<std::string> kept;
    bool any_block = false;
    for (const std::string& name : in.names()) {
        const SafetensorsEntry& e = in.shard(in.shard_of(name)).entry(name);
        if (e.shape.size() != 2 || !is_float_weight(e.dtype) || is_scale_name(in, name)) continue;
        const bool skipped = skip.skips(name);
        std::optional<Scheme> scheme = default_scheme;
        if (policy) {
            if (const PolicyLayer* l = policy->find(name, e.shape)) scheme = l->fp8 ? l->scheme : std::nullopt;
        }
        if (skipped || !scheme) {
            kept.push_back(name);
            continue;
        }
        const std::string sn = scale_name(name, *scheme);
        if (in.contains(sn)) throw Error(a.in + ": tensor '" + sn + "' exists already; it would collide with the scale of '" + name + "'");
        plan.emplace(name, *scheme);
        any_block = any_block || *scheme == Scheme::block128;
    }

    nlohmann::ordered_json qc = {{"quant_method", "fp8"},
                                 {"fmt", format == Format::e4m3fn ? "e4m3" : "e5m2"},
                                 {"activation_scheme", "dynamic"}};
    if (any_block) qc["weight_block_size"] = {128, 128};
    qc["fp8kit_scheme"] = to_string(default_scheme);
    qc["modules_to_not_convert"] = kept;
    CheckpointWriter writer(in, a.out, qc.dump());

    std::vector<Row> rows;
    size_t done = 0;
    for (size_t s = 0; s < in.shard_files().size(); ++s) {
        std::vector<std::pair<std::string, Tensor>> out;
        for (const std::string& name : in.shard(s).names()) {
            const Tensor t = in.shard(s).tensor(name);
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
            const Tensor scale = scheme == Scheme::tensor ? q.scale_inv.reshape({1}) : q.scale_inv;
            out.emplace_back(name, q.data);
            out.emplace_back(scale_name(name, scheme), scale);
            rows.push_back({name, scheme, t.nbytes(), q.data.nbytes() + scale.nbytes(),
                            compare(to_f32(t), dequantize(q, DType::f32)).sqnr_db});
            ++done;
        }
        writer.write_shard(s, out);
    }
    progress(done, plan.size(), "");
    writer.commit();

    std::printf("%-48s %-9s %14s %14s %9s\n", "tensor", "scheme", "bytes before", "bytes after", "SQNR dB");
    size_t before = 0, after = 0;
    for (const Row& r : rows) {
        std::printf("%-48s %-9s %14zu %14zu %9.2f\n", r.name.c_str(), std::string(to_string(r.scheme)).c_str(), r.before,
                    r.after, r.sqnr);
        before += r.before;
        after += r.after;
    }
    std::printf("%-48s %-9s %14zu %14zu\n", "total (quantized tensors)", "", before, after);
    std::printf("kept in high precision: %zu 2-D tensors%s\n", kept.size(), kept.empty() ? "" : " (skip rules or policy)");
}

}  // namespace

void add_quantize_command(CLI::App& app) {
    auto a = std::make_shared<QuantizeArgs>();
    CLI::App* c = app.add_subcommand("quantize", "quantize a safetensors checkpoint's weights to FP8 (file or shard directory)");
    c->add_option("IN", a->in, "input .safetensors file or directory of shards")->required();
    c->add_option("OUT", a->out, "output file or directory (must not be IN)")->required();
    c->add_option("--scheme", a->scheme,
                  "tensor (W_scale [1]), channel (W_scale [out,1]), block128 (DeepSeek-V3 W_scale_inv), mx32 (e8m0 W_scale)")
        ->capture_default_str();
    c->add_option("--format", a->format, "e4m3fn or e5m2")->capture_default_str();
    c->add_option("--skip", a->skip, "regular expressions of tensor names to keep in high precision (besides embeddings, norms, lm_head)");
    c->add_option("--policy", a->policy, "per-layer policy JSON (docs/CHECKPOINTS.md), e.g. from fp8kit advise");
    c->callback([a] {
        if (a->in == a->out) throw Error("OUT is the same path as IN; IN is never modified");
        run_quantize(*a);
    });
}

}  // namespace fp8kit::tools
