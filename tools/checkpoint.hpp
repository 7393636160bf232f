// tools/checkpoint.hpp: what the checkpoint subcommands (quantize, inspect, dequantize, verify,
// advise) share beyond the library's fp8kit/checkpoint.hpp (FP8 layouts, stored weights, the
// policy file) - a checkpoint that is one safetensors file or a directory of shards, SQNR, and
// writing a whole output (a file or a directory) that appears complete or not at all.
// Checked by tests/e2e/test_checkpoint.sh (and tests/e2e/check_checkpoint.py, against PyTorch).
// docs/CHECKPOINTS.md describes the layouts and the policy file for users.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/safetensors.hpp"

namespace fp8kit::tools {

// One safetensors file, or a directory: shards listed by model.safetensors.index.json's weight_map,
// else every *.safetensors file in it. A TensorLookup, for fp8kit::stored_weight and is_scale_name.
class Checkpoint final : public TensorLookup {
public:
    explicit Checkpoint(const std::string& path);
    bool is_directory() const noexcept { return directory_; }
    const std::string& path() const noexcept override { return path_; }
    const std::vector<std::string>& shard_files() const noexcept { return shard_files_; }  // names in the directory
    const SafetensorsFile& shard(size_t i) const { return shards_[i]; }
    size_t shard_of(const std::string& tensor) const;  // fp8kit::Error if absent
    const std::vector<std::string>& names() const noexcept { return names_; }  // shard order, then file order
    bool contains(const std::string& tensor) const noexcept override { return shard_index_.count(tensor) != 0; }
    Tensor tensor(const std::string& name) const override { return shards_[shard_of(name)].tensor(name); }
    const std::map<std::string, std::string>& metadata() const override { return shards_.front().metadata(); }

private:
    std::string path_;
    bool directory_ = false;
    std::vector<std::string> shard_files_;
    std::vector<SafetensorsFile> shards_;
    std::map<std::string, size_t> shard_index_;
    std::vector<std::string> names_;
};

// Names of weights that stay in high precision by default - embeddings, norms and the output head
// (as vLLM, torchao and compressed-tensors recipes leave them) - as a regular expression.
inline constexpr const char* default_skip_regex = "embed|norm|lm_head|wte|wpe";
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

// Float32 values of any floating tensor, or of an FP8 weight dequantized through its scale.
Tensor to_f32(const Tensor& t);
Tensor values_f32(const Checkpoint& c, const std::string& name);

// 20 log10(||ref|| / ||ref - x||) in double (inf when equal), and max |ref - x|.
struct ErrorStats {
    double sqnr_db, max_abs;
};
ErrorStats compare(const Tensor& ref_f32, const Tensor& x_f32);
ErrorStats compare(const double* ref, const float* x, int64_t n);  // the same over raw values

// Text of a small file (config.json, an index); fp8kit::Error naming it.
std::string read_text(const std::string& path);

// Writes an output that appears whole or not at all: a single file (replace-on-write), or a
// directory built under a temporary name beside it and renamed into place by commit(); destroyed
// without commit(), it leaves nothing. A directory output must not exist yet.
class Output {
public:
    Output(const std::string& path, bool directory);
    Output(const Output&) = delete;
    Output& operator=(const Output&) = delete;
    ~Output();
    // Where to write a file of the output: the path itself for a file output.
    std::string file(const std::string& name) const;
    void write_text(const std::string& name, const std::string& text) const;
    void commit();

private:
    std::string path_, temp_;
    bool directory_, committed_ = false;
};

// Writes a checkpoint shaped like `in` (the same shard file names): write_shard() per shard, then
// commit(), which for a directory also writes model.safetensors.index.json (weight_map and
// total_size), config.json with quantization_config set (or removed when none is given), and
// copies every other file of the input directory. Each shard's metadata is the input shard's with
// quantization_config replaced the same way. Nothing appears at the output path before commit().
class CheckpointWriter {
public:
    CheckpointWriter(const Checkpoint& in, const std::string& out, std::optional<std::string> quantization_config);
    void write_shard(size_t shard, const std::vector<std::pair<std::string, Tensor>>& tensors);
    void commit();

private:
    const Checkpoint& in_;
    Output out_;
    std::optional<std::string> qconfig_;
    std::vector<std::pair<std::string, std::string>> weight_map_;
    uint64_t total_size_ = 0;
};

// A one-line progress bar on stderr: "[####......] 3/8 name".
void progress(size_t done, size_t total, const std::string& what);

}  // namespace fp8kit::tools
