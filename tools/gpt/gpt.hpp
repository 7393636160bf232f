// tools/gpt/gpt.hpp: the GPT application behind `fp8kit train` and `fp8kit generate` - a byte-level
// GPT-2 built from the library's layers (<fp8kit/nn.hpp>), its training loop with every recipe,
// the built-in corpus, sampling, and its model files. An application of libfp8kit, not part of it:
// it uses the public headers only and is never installed (the static library fp8kit_gpt, for the
// command and its tests).
//
// Checked by tests/nn/test_torch_gpt.cpp (the float32 model against PyTorch), tests/nn/test_train.cpp
// and tests/nn/test_train_e2e.cpp (training), tests/nn/test_parameters.cpp (model files, FP8 ones
// included) and tests/e2e/test_cli.sh (the commands).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/nn.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit::gpt {

// ---- the model ----

struct GPTConfig {
    int64_t layers = 4, width = 128, heads = 4, context = 64, vocab = 256;
    // fp8kit::Error naming the field; also when the float32 parameters alone (parameter_bytes)
    // would not fit in this machine's memory - checked before anything is allocated.
    void validate() const;
    // The bytes of the float32 parameters, in double (no shape overflows it).
    double parameter_bytes() const;
    // The model file's __metadata__: "fp8kit.model": "gpt", "gpt.layers", ... "gpt.vocab".
    std::map<std::string, std::string> to_metadata() const;
    static GPTConfig from_metadata(const std::map<std::string, std::string>& m);
};

// GPT-2 layout with names: tok_embed, pos_embed, blocks.<i>.{norm1, attn.{qkv, proj}, norm2,
// mlp.{fc1, fc2}}, norm_f, lm_head. Token + position embeddings, pre-norm blocks (attention,
// GELU MLP), final norm, untied lm_head. Initialised as GPT-2: N(0, 0.02) weights, the residual
// projections (attn.proj, mlp.fc2) N(0, 0.02 / sqrt(2 layers)), zero biases, unit norms.
class GPT : public nn::Module {
public:
    GPT(const GPTConfig& cfg, uint64_t seed);
    std::string_view kind() const override { return "GPT"; }
    const GPTConfig& config() const noexcept { return cfg_; }
    Tensor forward(const Tensor& tokens);  // i32 [B, T] (T <= context) -> logits f32 [B, T, V]
    // forward + mean cross-entropy against targets i32 [B, T]; backward() then fills the grads.
    float loss(const Tensor& tokens, const Tensor& targets);
    void backward();
    void zero_grad();
    size_t activation_bytes() const;  // what forward keeps for backward, over all modules
    size_t weight_bytes() const;      // parameters as stored
    Device device() const;            // where the parameters are (Module::to moves them)

private:
    GPTConfig cfg_;
    nn::CrossEntropy ce_;
    int64_t b_ = 0, t_ = 0;
};

// ---- training (the `fp8kit train` job) ----

// The training recipes, in order: "f32", "bf16" (GEMM inputs rounded to bf16, f32 accumulation),
// and the FP8 recipes "tensorwise", "rowwise", "block", "delayed" (every Linear of the blocks as
// Float8Linear; lm_head stays in float32, as TransformerEngine and torchao recipes usually do).
const std::vector<std::string>& training_recipes();
std::string_view builtin_corpus();  // a few tens of KB of public-domain English (tools/gpt/corpus.txt)

struct TrainConfig {
    GPTConfig model;
    int64_t batch = 8, steps = 100;
    // Peak; linear warmup over the first 10% of steps, cosine to lr / 10. At 3e-3 the default
    // model's loss spiked as the warmup ended, and how hard each run spiked decided its final
    // loss: two recipes of one seed ended up to 12% apart by chance, every FP8 recipe's gap in
    // the table was noise. At 1e-3 no run spikes and the recipes of one seed stay within a few
    // tenths of a percent (README, "Reading the table").
    float lr = 1e-3f;
    uint64_t seed = 1;         // initialisation and data order (the same for every recipe)
    int64_t eval_batches = 4;  // held-out loss: the last 10% of the text, fixed windows
    // FP8 recipes: a policy file's per-layer decisions (nn::policy_plan); layers without an entry
    // get the run's recipe and the usual filter.
    std::optional<Policy> policy;
    // Where the model trains: the host, or Device::cuda (every layer op on the GPU; the bf16
    // recipe, which emulates bf16 GEMM inputs on the host, is refused there). The trained model
    // comes back to the host.
    Device device = Device::cpu;
    // fp8kit::Error naming the field; also when training would need more than this machine's
    // memory (memory_bytes), before anything is allocated.
    void validate() const;
    // A lower bound of what training holds at once: parameters, gradients and AdamW's two moments
    // (4 x parameter_bytes), and a batch's logits and MLP activations, in double.
    double memory_bytes() const;
};
// fp8kit::Error "<what> needs at least N GiB, more than this machine's M GiB of memory" when
// `bytes` exceeds the physical memory (fp8kit::physical_memory_bytes; nothing when unknown).
void check_fits_memory(double bytes, const std::string& what);

struct TrainResult {
    std::string recipe;
    std::vector<float> losses;    // training loss per step
    float final_loss = 0;         // held-out loss after the last step
    double seconds = 0;           // every step
    double tokens_per_second = 0; // after the warm-up steps (train_gpt), for every recipe alike
    size_t weight_bytes = 0;      // parameters (float32 masters) + grads + AdamW state
    size_t activation_bytes = 0;  // what forward keeps for backward (measured after a forward)
    std::string conversion;       // the conversion report (FP8 recipes)
    std::unique_ptr<GPT> model;
};

// Trains a fresh GPT(config.model, config.seed) on `text` (bytes are tokens) with one recipe.
// progress(step, loss) after every step. tokens/s leaves out the first steps (warm-up: first-touch
// allocations, delayed scaling's first amax, packing): max(1, steps / 20) of them when steps >= 2.
// With a policy, TrainResult::conversion says per Linear whether it ran in FP8, with which recipe,
// and why (the policy's reason, or the run's recipe and filter for layers it has no entry for).
TrainResult train_gpt(std::string_view text, const TrainConfig& config, const std::string& recipe,
                      const std::function<void(int64_t, float)>& progress = {});
// fp8kit::Error unless `text` is long enough for config (a training split and a held-out 10%,
// each longer than a context window): what train_gpt checks first, for callers to check early.
void check_training_text(std::string_view text, const TrainConfig& config);

// Samples `tokens` bytes after `prompt` (temperature 0.8 softmax sampling, reproducible for a seed),
// each passed to on_byte (if given) as soon as it is sampled.
std::string generate(GPT& model, const std::string& prompt, int64_t tokens, uint64_t seed,
                     const std::function<void(char)>& on_byte = {});

// ---- model files ----

// nn::save_parameters with the GPTConfig as metadata: every parameter as float32 under its
// qualified name, the shape in __metadata__ (GPTConfig::to_metadata).
void save_model(const GPT& model, const std::string& path);
// A GPT of the file's GPTConfig filled by nn::load_parameters: what save_model writes, or that
// file quantized by `fp8kit quantize` (any scheme), a file or a directory of shards; Linear
// weights stored in FP8 stay so (the model is then inference-only). fp8kit::Error naming the file
// and the problem (metadata missing or invalid, and every error of nn::load_parameters).
std::unique_ptr<GPT> load_model(const std::string& path);

}  // namespace fp8kit::gpt
