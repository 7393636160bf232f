// fp8kit/checkpoint.hpp: FP8 checkpoints beyond the file format - a checkpoint as one
// safetensors file or a directory of shards (reading, and writing one that appears whole or not
// at all, never over its input), the layouts in which FP8 weights are stored beside their scales
// (the community layouts), recognising a stored FP8 weight as a QTensor, and the conversion policy
// file written by `fp8kit advise`.
//
// Layouts (for a weight `W` [out, in]; the scale tensor is the dequantization multiplier,
// W ~ decode(W) * scale; the full table of what is read is at stored_weight below and in
// docs/CHECKPOINTS.md):
//   tensor   W FP8, W_scale [1]                          (compressed-tensors, AutoFP8, vLLM)
//   channel  W FP8, W_scale [out, 1]                     (compressed-tensors, fbgemm_fp8)
//   group    W FP8, W_scale [out, in/g]                  (compressed-tensors group; read only)
//   block128 W FP8, W_scale_inv f32 [ceil(out/b), ceil(in/b)], b from quantization_config's
//            weight_block_size, 128 by default (DeepSeek-V3, transformers FineGrainedFP8),
//            or W_scale over compressed-tensors' block_structure
//   mx32     W FP8, W_scale e8m0 [out, ceil(in/32)]      (OCP MX: one exponent per 1x32)
// Policy file: {"format": "fp8kit-policy", "version": 1, "layers": [{"name" | "weight_shape",
// "fp8", "recipe", "reason"}, ...]} (docs/CHECKPOINTS.md).
//
// Used by the checkpoint subcommands (tools/) and by nn::load_parameters / the nn conversions.
// Checked by tests/e2e/test_checkpoint.sh (each layout against PyTorch's own float64
// dequantization, policies applied by quantize), tests/e2e/test_checkpoint_safety.sh (outputs
// never over inputs, interrupts), tests/python/test_checkpoint_ecosystem.py (llm-compressor's
// checkpoints read bit for bit as compressed-tensors decompresses them),
// tests/nn/test_parameters.cpp (every layout loaded into a model) and tests/nn/test_model_conversion.cpp
// (policies applied to a model).
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

// group (compressed-tensors' group strategy, one scale per 1 x group_size) is read, not written.
enum class Scheme : uint8_t { tensor, channel, block128, mx32, group };
std::string_view to_string(Scheme s) noexcept;  // "tensor", "channel", "block128", "mx32", "group"
Scheme parse_scheme(std::string_view text);     // the four written; fp8kit::Error naming the value
Scaling scaling_of(Scheme s);                   // tensor, row, block(128, 128), mx32; Error for group
std::string scale_name(const std::string& weight, Scheme s);  // W_scale, or W_scale_inv for block128
// The training recipe of each layout and back: tensorwise, rowwise, block, mxfp8 (the names of
// parse_recipe; fp8kit::Error for another name).
std::string_view recipe_of(Scheme s) noexcept;
Scheme scheme_of_recipe(std::string_view recipe);

// Named tensors to look FP8 weights up in: one safetensors file (SafetensorsLookup), or a
// checkpoint that is a file or a directory of shards (Checkpoint).
class TensorLookup {
public:
    virtual ~TensorLookup() = default;
    virtual const std::string& path() const noexcept = 0;  // named in error messages
    virtual bool contains(const std::string& name) const noexcept = 0;
    virtual Tensor tensor(const std::string& name) const = 0;  // fp8kit::Error if absent
    virtual const std::map<std::string, std::string>& metadata() const = 0;
    // The quantization_config JSON that describes the tensors, if any: the metadata's (and for a
    // Checkpoint directory, config.json's first).
    virtual std::optional<std::string> quantization_config() const {
        const auto it = metadata().find("quantization_config");
        return it == metadata().end() ? std::nullopt : std::optional<std::string>(it->second);
    }
    // The file that quantization_config() comes from, which its errors name (a config.json, not
    // the shard whose weights it describes).
    virtual std::string quantization_config_where() const { return path(); }
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

// ---- checkpoints on disk ----

// One safetensors file, or a directory: the shards listed by model.safetensors.index.json's
// weight_map, else every *.safetensors file in it; config.json beside them is read for its
// quantization_config. Only regular files are opened. fp8kit::Error naming the path for a
// missing, non-regular or malformed file, an index naming a missing shard or a tensor its shard
// does not hold, a tensor in two shards.
class Checkpoint final : public TensorLookup {
public:
    explicit Checkpoint(const std::string& path);
    bool is_directory() const noexcept { return directory_; }
    const std::string& path() const noexcept override { return path_; }
    const std::vector<std::string>& shard_files() const noexcept { return shard_files_; }  // names in the directory
    const SafetensorsFile& shard(size_t i) const { return shards_[i]; }
    size_t shard_of(const std::string& tensor) const;  // fp8kit::Error if absent
    const SafetensorsEntry& entry(const std::string& tensor) const { return shards_[shard_of(tensor)].entry(tensor); }
    const std::vector<std::string>& names() const noexcept { return names_; }  // shard order, then file order
    bool contains(const std::string& tensor) const noexcept override { return shard_index_.count(tensor) != 0; }
    Tensor tensor(const std::string& name) const override { return shards_[shard_of(name)].tensor(name); }
    const std::map<std::string, std::string>& metadata() const override { return shards_.front().metadata(); }
    std::optional<std::string> quantization_config() const override;
    std::string quantization_config_where() const override { return quantization_config_where_; }
    // A directory's config.json (its text), if it has one.
    const std::optional<std::string>& config_json() const noexcept { return config_; }
    // Every file the checkpoint reads (the path itself for a file; the shards, index and
    // config.json of a directory): what an output must never be.
    std::vector<std::string> files() const;

private:
    std::string path_;
    bool directory_ = false;
    std::vector<std::string> shard_files_;
    std::vector<SafetensorsFile> shards_;
    std::map<std::string, size_t> shard_index_;
    std::vector<std::string> names_;
    std::optional<std::string> config_;
    // quantization_config(), found once: every stored weight asks for it, and a config of
    // megabytes parsed for each made loading quadratic. A config.json beside a single file that
    // cannot be read is an error when the config is asked for (a file without FP8 weights never
    // asks), so its message is kept until then.
    std::optional<std::string> quantization_config_;
    std::string quantization_config_where_, quantization_config_error_;
    std::optional<std::string> find_quantization_config(std::string& where) const;
};

// The rules for an output path, checked before any work; fp8kit::Error naming the path:
//  - its folder must exist;
//  - it must not be one of `inputs`, hold one, or lie inside one (an input directory), compared
//    as files (device and inode, or the platform's equivalent: through links and relative paths);
//  - if anything is there (a file, a directory, a link - dangling too -, a FIFO), it is replaced
//    only with `force`, and only by the same kind (a directory by a directory, the rest by a file).
void check_output(const std::string& out, bool directory, const std::vector<std::string>& inputs, bool force);
// Removes the temporaries that a killed run writing `out` left beside it (platform temporaries
// named "<out>.tmp-<pid>-<n>" whose process is gone) and returns their paths.
std::vector<std::string> remove_stale_temporaries(const std::string& out);

// Writes a checkpoint shaped like `in` (the same shard file names): write_shard() per shard, then
// commit(). A directory output is built in a temporary directory beside it, renamed into place by
// commit() - which also writes model.safetensors.index.json (weight_map, total_size), config.json
// (in's, with quantization_config set, or removed when none is given) and copies in's other
// files. Each shard's metadata is in's with quantization_config replaced the same way. Nothing
// appears at `out` before commit(); destroyed without it, or on an interrupt, it leaves nothing.
// check_output() must have passed (with `force` to replace an existing output).
class CheckpointWriter {
public:
    CheckpointWriter(const Checkpoint& in, std::string out, std::optional<std::string> quantization_config);
    CheckpointWriter(const CheckpointWriter&) = delete;
    CheckpointWriter& operator=(const CheckpointWriter&) = delete;
    ~CheckpointWriter();
    void write_shard(size_t shard, const std::vector<std::pair<std::string, Tensor>>& tensors);
    void commit();

private:
    std::string file(const std::string& name);  // where a file of the output goes
    void write_text(const std::string& name, const std::string& text);
    const Checkpoint& in_;
    std::string out_, temp_;
    std::vector<int> cleanup_slots_;  // the temporary directory and its files
    std::optional<std::string> qconfig_;
    std::vector<std::pair<std::string, std::string>> weight_map_;
    uint64_t total_size_ = 0;
    bool committed_ = false;
};

// The block size quantization_config names ([rows, cols]: weight_block_size, or a
// compressed-tensors group's block_structure), if any; fp8kit::Error naming the path for one
// that is not two positive integers.
std::optional<std::vector<int64_t>> weight_block_size(const TensorLookup& t);

// An FP8 weight in one of the layouts real producers write, detected from names, dtypes and
// shapes and cross-checked with quantization_config: `W_scale` f32/bf16/f16 [1] (per tensor:
// compressed-tensors, AutoFP8, vLLM), [out] or [out, 1] (per channel: compressed-tensors,
// fbgemm_fp8 rows), [out, in/g] (compressed-tensors group), the block grid
// [ceil(out/b0), ceil(in/b1)] (compressed-tensors block, b from block_structure); `W_scale_inv`
// f32 over blocks of weight_block_size, 128x128 by default (transformers FineGrainedFP8 /
// DeepSeek-V3); e8m0 [out, ceil(in/32)] (OCP MX); `<module>.scale_weight` [] or [1] (ComfyUI's
// scaled fp8, per tensor). A 3-D [experts, out, in] tensor (MoE experts)
// is the matrix [experts * out, in], with scales per expert, per expert and channel or per
// expert and block. Its data and scales as a QTensor over that matrix (scales as f32, exactly,
// or e8m0), its shape, the scheme, the scale tensor's name and the static activation scale
// beside it (compressed-tensors' `<module>.input_scale`), if any. std::nullopt for a tensor that
// is not FP8, or is itself a scale (e8m0), or has no scale tensor; fp8kit::Error naming the path
// and the tensor for an FP8 weight whose scale has a dtype or shape no layout (or not the
// config's) explains.
struct StoredWeight {
    Scheme scheme;
    std::string scale;
    QTensor q;
    Shape shape;              // the stored tensor's (q is its matrix view)
    std::string input_scale;  // empty when there is none
};
std::optional<StoredWeight> stored_weight(const TensorLookup& t, const std::string& name);
// The flat index of the first code of an FP8 weight's codes (any FP8 dtype but e8m0) that is
// not a number (NaN; e5m2's Inf), if any: what the loaders that run a checkpoint refuse, since one
// such code makes every output it reaches NaN (stored_weight reads only the scales: fp8kit
// inspect reads no weight). fp8kit::Error for codes of another dtype.
std::optional<int64_t> first_nonfinite_code(const Tensor& codes);
// fp8kit::Error "<where>: '<name>' holds the code 0x.. (not a number) at row r, column c of its
// [rows, cols] matrix: ..." where a stored FP8 weight's codes hold one (first_nonfinite_code): the
// check of every reader that decodes or runs the codes.
void check_codes_finite(const StoredWeight& w, const std::string& name, const std::string& where);
// A tensor that belongs to an FP8 weight's layout, not to the model: W_scale / W_scale_inv of an
// FP8 W, the input_scale of its module, ComfyUI's scale_weight / scale_input beside it, or
// ComfyUI's scaled_fp8 marker (is_comfy_marker). What dequantize drops.
bool is_scale_name(const TensorLookup& t, const std::string& name);
// ComfyUI's "scaled fp8" marker: a tensor named scaled_fp8 (under any prefix) of an FP8 dtype and
// at most 2 elements, whose dtype says the weights' format (its model detection pops it).
bool is_comfy_marker(const TensorLookup& t, const std::string& name);
// "<module>.scale_weight" for "<module>.weight" (ComfyUI's scaled fp8: the weight's dequantization
// multiplier, one value), else "".
std::string comfy_scale_name(const std::string& weight);
// "<module>.input_scale" for "<module>.weight", else "".
std::string input_scale_name(const std::string& weight);

// ---- the conversion policy ----

struct PolicyLayer {
    std::string name;                   // weight name or its module prefix; empty: match by shape
    std::vector<int64_t> weight_shape;  // [out, in]; empty: match by name
    bool fp8 = true;
    std::optional<Scheme> scheme;       // required when fp8: the weight's stored layout
    std::string reason;
    // false for the recipe weight_only: the weight stored per row (channel) and the input not
    // quantized where the layer runs (the weight-only GEMM) - an inference recipe, which training
    // conversions refuse.
    bool quantize_input = true;
    // scheme and quantize_input from a policy's recipe name: tensorwise, rowwise, block, mxfp8
    // (scheme_of_recipe) or weight_only; fp8kit::Error naming another.
    void set_recipe(std::string_view recipe);
    // The recipe name set_recipe takes back; "" without a scheme.
    std::string_view recipe() const;
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
// policy_json(p) written to path, replace-on-write.
void write_policy(const std::string& path, const Policy& p);

}  // namespace fp8kit
