// tools/inspect.cpp: `fp8kit inspect FILE` - the tensors of a safetensors checkpoint (a file or a
// directory of shards): dtype, shape, bytes and, for FP8 weights, the layout their scale shows
// (tools/checkpoint.hpp), then the scheme(s) detected and the quantization_config metadata.
// Checked by tests/e2e/test_checkpoint.sh.
#include <cstdio>
#include <iostream>
#include <memory>
#include <set>

#include "checkpoint.hpp"
#include "commands.hpp"

namespace fp8kit::tools {

namespace {

void run_inspect(const std::string& path) {
    const Checkpoint c(path);
    std::printf("%s: %zu tensors in %zu file(s)\n", path.c_str(), c.names().size(), c.shard_files().size());
    std::printf("%-52s %-8s %-16s %12s  %s\n", "tensor", "dtype", "shape", "bytes", "quantization");
    std::set<std::string> schemes;
    size_t total = 0;
    for (const std::string& name : c.names()) {
        const SafetensorsEntry& e = c.shard(c.shard_of(name)).entry(name);
        std::string quant = "-";
        if (const auto w = stored_weight(c, name)) {
            quant = std::string(to_string(w->scheme)) + " " + std::string(to_string(w->q.format())) + " (scale " + w->scale + ")";
            schemes.insert(std::string(to_string(w->scheme)));
        } else if (is_scale_name(c, name)) {
            quant = "scale";
        } else if (is_fp8(e.dtype)) {
            quant = "FP8 without a scale";
        }
        std::printf("%-52s %-8s %-16s %12llu  %s\n", name.c_str(), std::string(safetensors_dtype_name(e.dtype)).c_str(),
                    to_string(e.shape).c_str(), static_cast<unsigned long long>(e.end - e.begin), quant.c_str());
        total += size_t(e.end - e.begin);
    }
    std::string detected = schemes.empty() ? "none (not an FP8 checkpoint)" : "";
    for (const std::string& s : schemes) detected += (detected.empty() ? "" : " + ") + s;
    std::printf("total bytes: %zu\ndetected quantization: %s\n", total, detected.c_str());
    const auto it = c.metadata().find("quantization_config");
    if (it != c.metadata().end()) std::printf("quantization_config: %s\n", it->second.c_str());
}

}  // namespace

void add_inspect_command(CLI::App& app) {
    auto path = std::make_shared<std::string>();
    CLI::App* c = app.add_subcommand("inspect", "list a safetensors checkpoint's tensors and detect its FP8 scheme");
    c->add_option("FILE", *path, ".safetensors file or directory of shards")->required();
    c->callback([path] { run_inspect(*path); });
}

}  // namespace fp8kit::tools
