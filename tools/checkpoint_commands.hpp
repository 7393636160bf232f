// tools/checkpoint_commands.hpp: what the checkpoint subcommands (quantize, inspect, dequantize, verify,
// advise) share beyond the library's fp8kit/checkpoint.hpp (checkpoints on disk, FP8 layouts,
// stored weights, the policy file): the skip rule, values as float32, SQNR, non-finite values,
// the options every writing command takes, and progress on a terminal.
// Checked by tests/e2e/test_checkpoint.sh, tests/e2e/test_checkpoint_safety.sh and
// tests/e2e/check_checkpoint.py (against PyTorch).
// docs/CHECKPOINTS.md describes the layouts, the commands and the policy file for users.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "fp8kit/checkpoint.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/safetensors.hpp"

namespace fp8kit::tools {

// Names of weights that stay in high precision by default - embeddings, norms, the output head
// (as vLLM, torchao and compressed-tensors recipes leave them) and MoE routers (`mlp.gate`,
// `shared_expert_gate`, kept
// by DeepSeek-V3's and Qwen-MoE's FP8 checkpoints and by vLLM) - as a regular expression.
inline constexpr const char* default_skip_regex =
    "embed|norm|lm_head|wte|wpe|(^|\\.)mlp\\.gate\\.weight$|shared_expert_gate|router";
// The default rule plus `extra` regular expressions (ECMAScript, searched anywhere in the name);
// fp8kit::Error naming a pattern that does not parse.
class SkipRule {
public:
    explicit SkipRule(const std::vector<std::string>& extra = {});
    bool skips(const std::string& name) const;

private:
    struct Impl;
    std::shared_ptr<const Impl> impl_;
};
// f32, bf16 or f16: the weight dtypes quantize and advise work on.
bool is_float_weight(DType d) noexcept;
// The module a weight belongs to, as loaders name what they leave unquantized
// ("model.layers.0.mlp.up_proj" for "model.layers.0.mlp.up_proj.weight").
std::string module_name(const std::string& weight);

// Float32 values of any floating tensor, or of an FP8 weight dequantized through its scale.
Tensor to_f32(const Tensor& t);
Tensor values_f32(const TensorLookup& c, const std::string& name);

// The first value of a float32 tensor that is NaN or Inf: its index (as "[i, j]") and kind, and
// how many there are; std::nullopt when all are finite.
struct NonFinite {
    std::string index, kind;  // kind: "NaN", "+Inf" or "-Inf"
    int64_t count;
};
std::optional<NonFinite> find_non_finite(const Tensor& f32);

// 20 log10(||ref|| / ||ref - x||) in double (inf when equal), and max |ref - x|.
struct ErrorStats {
    double sqnr_db, max_abs;
};
ErrorStats compare(const Tensor& ref_f32, const Tensor& x_f32);
ErrorStats compare(const double* ref, const float* x, int64_t n);  // the same over raw values

// Options of the commands that write a checkpoint or a file.
struct OutputArgs {
    bool force = false, quiet = false, json = false;
};
void add_output_flags(CLI::App* c, OutputArgs& a, bool json);
// Checks OUT (fp8kit::check_output) and removes what a killed earlier run left (saying so unless
// quiet). Before any work.
void prepare_output(const std::string& out, bool directory, const std::vector<std::string>& inputs, const OutputArgs& a);

// A one-line progress bar on stderr, "[####......] 3/8 name", drawn only when stderr is a terminal
// and not --quiet.
class Progress {
public:
    explicit Progress(bool quiet);
    void operator()(size_t done, size_t total, const std::string& what) const;

private:
    bool on_;
};

}  // namespace fp8kit::tools
