// tools/dequantize.cpp: `fp8kit dequantize IN OUT --dtype bf16|f32` - every FP8 weight with a scale
// (any layout of tools/checkpoint.hpp) back to high precision, decode(code) * scale (fp8kit::dequantize),
// its scale tensor dropped, other tensors copied; quantization_config removed. OUT appears whole or
// not at all. Checked by tests/e2e/test_checkpoint.sh and tests/e2e/check_checkpoint.py.
#include <memory>

#include "checkpoint.hpp"
#include "commands.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit::tools {

namespace {

struct DequantizeArgs {
    std::string in, out, dtype = "bf16";
};

void run_dequantize(const DequantizeArgs& a) {
    const DType dtype = parse_dtype(a.dtype);
    if (dtype != DType::bf16 && dtype != DType::f32) throw Error("--dtype " + a.dtype + ": expected bf16 or f32");
    const Checkpoint in(a.in);
    CheckpointWriter writer(in, a.out, std::nullopt);
    size_t done = 0;
    for (size_t s = 0; s < in.shard_files().size(); ++s) {
        std::vector<std::pair<std::string, Tensor>> out;
        for (const std::string& name : in.shard(s).names()) {
            progress(done++, in.names().size(), name);
            if (is_scale_name(in, name)) continue;
            if (const auto w = stored_weight(in, name)) {
                out.emplace_back(name, dequantize(w->q, dtype));
            } else {
                out.emplace_back(name, in.shard(s).tensor(name));
            }
        }
        writer.write_shard(s, out);
    }
    progress(done, in.names().size(), "");
    writer.commit();
}

}  // namespace

void add_dequantize_command(CLI::App& app) {
    auto a = std::make_shared<DequantizeArgs>();
    CLI::App* c = app.add_subcommand("dequantize", "FP8 weights of a checkpoint back to bf16 or f32");
    c->add_option("IN", a->in, "input .safetensors file or directory of shards")->required();
    c->add_option("OUT", a->out, "output file or directory")->required();
    c->add_option("--dtype", a->dtype, "bf16 or f32")->capture_default_str();
    c->callback([a] {
        if (a->in == a->out) throw Error("OUT is the same path as IN; IN is never modified");
        run_dequantize(*a);
    });
}

}  // namespace fp8kit::tools
