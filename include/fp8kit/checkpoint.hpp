// fp8kit/checkpoint.hpp: FP8 checkpoints beyond the file format - the layouts in which FP8
// weights are stored beside their scales (the community layouts), recognising a stored FP8
// weight as a QTensor, and the conversion policy file written by `fp8kit advise`.
//
// Layouts (for a weight `W` [out, in]; the scale tensor is the dequantization multiplier,
// W ~ decode(W) * scale):
//   tensor   W FP8, W_scale f32 [1]                      (vLLM / compressed-tensors per-tensor)
//   channel  W FP8, W_scale f32 [out, 1]                 (compressed-tensors per-channel)
//   block128 W FP8, W_scale_inv f32 [ceil(out/b), ceil(in/b)], b from the metadata's
//            quantization_config.weight_block_size, 128 by default   (DeepSeek-V3)
//   mx32     W FP8, W_scale e8m0 [out, ceil(in/32)]      (OCP MX: one exponent per 1x32)
// Policy file: {"format": "fp8kit-policy", "version": 1, "layers": [{"name" | "weight_shape",
// "fp8", "recipe", "reason"}, ...]} (docs/CHECKPOINTS.md).
//
// Used by the checkpoint subcommands (tools/) and by nn::load_model / the nn conversions.
// Checked by tests/e2e/test_checkpoint.sh (each layout against PyTorch's own float64
// dequantization, policies applied by quantize), tests/nn/test_checkpoint.cpp (every layout
// loaded into a model) and tests/nn/test_convert.cpp (policies applied to a model).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8kit/quantize.hpp"
#include "fp8kit/safetensors.hpp"

namespace fp8kit {

// ---- FP8 weight layouts ----

enum class Scheme : uint8_t { tensor, channel, block128, mx32 };
std::string_view to_string(Scheme s) noexcept;  // "tensor", "channel", "block128", "mx32"
Scheme parse_scheme(std::string_view text);     // fp8kit::Error naming the value
Scaling scaling_of(Scheme s);                   // tensor, row, block(128, 128), mx32
std::string scale_name(const std::string& weight, Scheme s);  // W_scale, or W_scale_inv for block128
// The training recipe of each layout and back: tensorwise, rowwise, block, mxfp8 (the names of
// parse_recipe; fp8kit::Error for another name).
std::string_view recipe_of(Scheme s) noexcept;
Scheme scheme_of_recipe(std::string_view recipe);

// Named tensors to look FP8 weights up in: one safetensors file (SafetensorsLookup), or a
// checkpoint directory of shards (the command's tools::Checkpoint).
class TensorLookup {
public:
    virtual ~TensorLookup() = default;
    virtual const std::string& path() const noexcept = 0;  // named in error messages
    virtual bool contains(const std::string& name) const noexcept = 0;
    virtual Tensor tensor(const std::string& name) const = 0;  // fp8kit::Error if absent
    virtual const std::map<std::string, std::string>& metadata() const = 0;
};
class SafetensorsLookup final : public TensorLookup {
public:
    explicit SafetensorsLookup(SafetensorsFile file) : file_(std::move(file)) {}
    const std::string& path() const noexcept override { return file_.path(); }
    bool contains(const std::string& name) const noexcept override { return file_.contains(name); }
    Tensor tensor(const std::string& name) const override { return file_.tensor(name); }
    const std::map<std::string, std::string>& metadata() const override { return file_.metadata(); }
    const SafetensorsFile& file() const noexcept { return file_; }

private:
    SafetensorsFile file_;
};

// quantization_config.weight_block_size from the metadata ([rows, cols]), if any; fp8kit::Error
// naming the path for one that is not two positive integers.
std::optional<std::vector<int64_t>> weight_block_size(const TensorLookup& t);

// An FP8 weight in one of the layouts above: its data and scale as a QTensor (views of the
// lookup's tensors), the scheme and the scale tensor's name. std::nullopt for a tensor that is
// not FP8, or is itself a scale (e8m0), or has no scale tensor; fp8kit::Error naming the path and
// the tensor for an FP8 weight whose scale has a dtype or shape no layout explains.
struct StoredWeight {
    Scheme scheme;
    std::string scale;
    QTensor q;
};
std::optional<StoredWeight> stored_weight(const TensorLookup& t, const std::string& name);
bool is_scale_name(const TensorLookup& t, const std::string& name);  // W_scale / W_scale_inv of an FP8 W

// ---- the conversion policy ----

struct PolicyLayer {
    std::string name;                   // weight name or its module prefix; empty: match by shape
    std::vector<int64_t> weight_shape;  // [out, in]; empty: match by name
    bool fp8 = true;
    std::optional<Scheme> scheme;       // required when fp8
    std::string reason;
};
struct Policy {
    std::vector<PolicyLayer> layers;
    // The entry for a weight: the first whose name is the weight's or a module prefix of it
    // ("blocks.0.mlp" matches "blocks.0.mlp.fc1.weight"), else the first of the same shape;
    // nullptr if none.
    const PolicyLayer* find(const std::string& weight, const Shape& shape) const;
};
// fp8kit::Error naming the file and the layer for anything malformed (docs/CHECKPOINTS.md).
Policy read_policy(const std::string& path);
std::string policy_json(const Policy& p);

}  // namespace fp8kit
