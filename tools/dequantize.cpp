// tools/dequantize.cpp: `fp8kit dequantize IN OUT --dtype bf16|f32 [--force] [--quiet]` - every
// FP8 weight with a scale (any layout fp8kit::stored_weight reads) back to high precision,
// decode(code) * scale (fp8kit::dequantize; for bf16 scales the product is exact in f32 and
// rounds once, as compressed-tensors' own bf16 decompression does), its weight scale and static
// input_scale dropped, other tensors copied; quantization_config removed. A weight holding a code
// that is not a number (a damaged file) is bad input, named. OUT is checked before any work (never
// IN; an existing one only with --force) and appears whole or not at all.
// Checked by tests/e2e/test_checkpoint.sh, tests/e2e/check_checkpoint.py and
// tests/python/test_checkpoint_ecosystem.py (bit for bit against compressed-tensors).
#include <memory>

#include "checkpoint_commands.hpp"
#include "commands.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit::tools {

namespace {

struct DequantizeArgs {
    std::string in, out, dtype = "bf16";
    OutputArgs o;
};

void run_dequantize(const DequantizeArgs& a) {
    const DType dtype = parse_dtype(a.dtype);
    if (dtype != DType::bf16 && dtype != DType::f32) throw Error("--dtype " + a.dtype + ": expected bf16 or f32");
    std::unique_ptr<Checkpoint> in;
    reading_inputs([&] { in = std::make_unique<Checkpoint>(a.in); });
    prepare_output(a.out, in->is_directory(), in->files(), a.o);
    reading_inputs([&] {
        std::unique_ptr<CheckpointWriter> writer;
        writing_output([&] { writer = std::make_unique<CheckpointWriter>(*in, a.out, std::nullopt); });
        const Progress progress(a.o.quiet);
        size_t done = 0;
        for (size_t s = 0; s < in->shard_files().size(); ++s) {
            std::vector<std::pair<std::string, Tensor>> out;
            for (const std::string& name : in->shard(s).names()) {
                progress(done++, in->names().size(), name);
                if (is_scale_name(*in, name)) continue;
                if (const auto w = stored_weight(*in, name)) {
                    // A NaN code would be written as a NaN weight (exit 3 instead, naming it).
                    check_codes_finite(*w, name, quote_printable(in->shard(s).path()));
                    out.emplace_back(name, dequantize(w->q, dtype).reshape(w->shape));
                } else {
                    out.emplace_back(name, in->shard(s).tensor(name));
                }
            }
            writing_output([&] { writer->write_shard(s, out); });
        }
        progress(done, in->names().size(), "");
        writing_output([&] { writer->commit(); });
    });
}

}  // namespace

void add_dequantize_command(CLI::App& app) {
    auto a = std::make_shared<DequantizeArgs>();
    CLI::App* c = app.add_subcommand("dequantize", "FP8 weights of a checkpoint back to bf16 or f32");
    c->add_option("IN", a->in, "input .safetensors file or directory of shards (only read)")->required()->check(not_empty);
    c->add_option("OUT", a->out, "output file or directory (never IN; an existing one only with --force)")->required()->check(not_empty);
    c->add_option("--dtype", a->dtype, "bf16 or f32")->capture_default_str();
    add_output_flags(c, a->o, false);
    c->footer(std::string("Examples:\n  fp8kit dequantize model-fp8/ model-bf16/ --dtype bf16\n") + exit_codes_help);
    c->callback([a] { run_dequantize(*a); });
}

}  // namespace fp8kit::tools
