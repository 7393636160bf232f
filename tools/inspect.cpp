// tools/inspect.cpp: `fp8kit inspect FILE [--json]` - the tensors of a safetensors checkpoint (a
// file or a directory of shards): dtype, shape, bytes and, for FP8 weights, the layout their
// scales show (fp8kit::stored_weight: scheme, scale groups, scale tensor, static input scale),
// then the scheme(s) detected and the quantization_config (config.json's for a directory, else
// the metadata's) with the producer it names.
// Checked by tests/e2e/test_checkpoint.sh and tests/python/test_checkpoint_ecosystem.py (the
// schemes of llm-compressor's checkpoints).
#include <cstdio>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint_commands.hpp"
#include "commands.hpp"
#include "fp8kit/files.hpp"

namespace fp8kit::tools {

namespace {

using Json = nlohmann::ordered_json;

// Who wrote a quantization_config, from its quant_method (and format).
std::string producer(const Json& q) {
    const auto text = [&](const char* key, const char* otherwise) {  // a string field, whatever the file holds there
        return q.contains(key) && q[key].is_string() ? q[key].get<std::string>() : std::string(otherwise);
    };
    const std::string m = text("quant_method", "");
    if (m == "compressed-tensors") return "compressed-tensors (" + text("format", "?") + ")";
    if (m == "fp8") return "transformers FineGrainedFP8 / DeepSeek-V3 (fp8)";
    if (m == "fbgemm_fp8") return "FBGEMM fp8 (fbgemm_fp8)";
    if (m == "fp8kit") return "fp8kit";
    return m.empty() ? "unknown" : m;
}

void run_inspect(const std::string& path, bool json) {
    std::unique_ptr<Checkpoint> c;
    Json tensors = Json::array();
    std::set<std::string> schemes;
    size_t total = 0;
    std::optional<std::string> qc;
    bool comfy = false;  // the file holds ComfyUI's scaled_fp8 marker
    reading_inputs([&] {
        c = std::make_unique<Checkpoint>(path);
        qc = c->quantization_config();
        for (const std::string& name : c->names()) {
            const SafetensorsEntry& e = c->entry(name);
            Json t = {{"name", name}, {"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"bytes", e.end - e.begin}};
            if (const auto w = stored_weight(*c, name)) {
                t["quantization"] = {{"scheme", to_string(w->scheme)}, {"format", to_string(w->q.format())},
                                     {"scaling", to_string(w->q.scaling)}, {"scale", w->scale},
                                     {"input_scale", w->input_scale.empty() ? Json(nullptr) : Json(w->input_scale)}};
                schemes.insert(std::string(to_string(w->scheme)));
            } else if (is_comfy_marker(*c, name)) {
                t["quantization"] = "marker (ComfyUI scaled fp8)";
                comfy = true;
            } else if (is_scale_name(*c, name)) {
                t["quantization"] = "scale";
            } else if (is_fp8(e.dtype) && e.dtype != DType::e8m0fnu) {
                t["quantization"] = "FP8 without a scale";
            } else {
                t["quantization"] = nullptr;
            }
            total += size_t(e.end - e.begin);
            tensors.push_back(std::move(t));
        }
    });
    const Json q = qc ? Json::parse(*qc, nullptr, false) : Json(nullptr);
    // Who wrote it: the config's producer, else ComfyUI where its marker says so.
    const Json who = q.is_object() ? Json(producer(q)) : comfy ? Json("ComfyUI (scaled fp8)") : Json(nullptr);
    if (json) {
        std::printf("%s\n", Json{{"path", path}, {"files", c->shard_files()}, {"tensors", tensors}, {"total_bytes", total},
                                 {"detected", schemes}, {"producer", who},
                                 {"quantization_config", q}}.dump().c_str());
        return;
    }
    // Names and the config as the file holds them, escaped (fp8kit::printable): never raw to a terminal.
    std::printf("%s: %zu tensors in %zu file(s)\n", path.c_str(), c->names().size(), c->shard_files().size());
    std::printf("%-52s %-8s %-16s %12s  %s\n", "tensor", "dtype", "shape", "bytes", "quantization");
    for (const Json& t : tensors) {
        std::string quant = "-";
        if (t["quantization"].is_string()) quant = t["quantization"].get<std::string>();
        if (t["quantization"].is_object()) {
            const Json& w = t["quantization"];
            quant = w["scheme"].get<std::string>() + " " + w["format"].get<std::string>() + " " + w["scaling"].get<std::string>() +
                    " (scale " + printable(w["scale"].get<std::string>()) +
                    (w["input_scale"].is_string() ? ", static input scale " + printable(w["input_scale"].get<std::string>()) : "") + ")";
        }
        std::printf("%-52s %-8s %-16s %12llu  %s\n", printable(t["name"].get<std::string>()).c_str(), t["dtype"].get<std::string>().c_str(),
                    to_string(t["shape"].get<Shape>()).c_str(), t["bytes"].get<unsigned long long>(), quant.c_str());
    }
    std::string detected = schemes.empty() ? "none (not an FP8 checkpoint)" : "";
    for (const std::string& s : schemes) detected += (detected.empty() ? "" : " + ") + s;
    std::printf("total bytes: %zu\ndetected quantization: %s\n", total, detected.c_str());
    if (!qc && comfy) std::printf("producer: ComfyUI (scaled fp8), no quantization_config\n");
    if (qc) std::printf("quantization_config (%s): %s\n", q.is_object() ? printable(producer(q)).c_str() : "not JSON", printable(*qc).c_str());
}

}  // namespace

void add_inspect_command(CLI::App& app) {
    auto path = std::make_shared<std::string>();
    auto json = std::make_shared<bool>(false);
    CLI::App* c = app.add_subcommand("inspect", "list a safetensors checkpoint's tensors and detect its FP8 scheme");
    c->add_option("FILE", *path, ".safetensors file or directory of shards")->required()->check(not_empty);
    c->add_flag("--json", *json, "print one JSON object on stdout instead of the table");
    c->footer(std::string("Examples:\n  fp8kit inspect model-fp8/\n  fp8kit inspect model-fp8/model.safetensors --json\n") + exit_codes_help);
    c->callback([path, json] { run_inspect(*path, *json); });
}

}  // namespace fp8kit::tools
