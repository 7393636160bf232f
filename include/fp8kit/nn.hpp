// fp8kit/nn.hpp: layers, FP8 training layers, conversion policies and parameter files, built
// only on the public fp8kit operations (quantize, gemm, ...), so they run on any backend.
//
//  - Module: a tree of named modules (qualified names like "blocks.3.mlp.fc1") owning float32
//    Parameters (value + grad). Layers: Linear, LayerNorm, RMSNorm, GELU, CausalSelfAttention,
//    Embedding; cross_entropy; AdamW (float32 master weights: the parameters themselves).
//  - Float8Linear: a Linear whose GEMMs run in FP8 with a Recipe; convert_to_float8_training
//    swaps Linear modules for it with a filter (torchao's convert_to_float8_training).
//  - enable_layerwise_casting: weights stored in FP8, upcast per layer at forward (Diffusers).
//  - save_parameters / load_parameters: a module's parameters as a safetensors file, loaded back
//    also after `fp8kit quantize` (FP8 Linear weights kept in FP8).
// Models built from these live with their applications: the GPT of `fp8kit train` in tools/gpt.
//
// Numerics and how each part is checked: docs/NUMERICS.md ("Layers"), tests/nn/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/gemm.hpp"
#include "fp8kit/recipe.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit::nn {

// ---- modules ----

struct Parameter {
    Tensor value;  // f32; undefined while the weight is stored in FP8
    Tensor grad;   // f32, same shape; undefined while stored in FP8
    // The FP8 copy that replaces value: layerwise casting (tensor scaling, or the policy's
    // recipe), or an FP8 weight loaded from a checkpoint (any layout of fp8kit/checkpoint.hpp).
    std::optional<QTensor> stored;
    // The float32 value to compute with: value, or the FP8 copy dequantized (a temporary).
    Tensor compute_value() const;
    size_t bytes() const;  // value, or the FP8 codes + scales when stored
};

class Module {
public:
    virtual ~Module() = default;
    virtual std::string_view kind() const = 0;  // "Linear", "Float8Linear", "LayerNorm", ...

    const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const noexcept { return children_; }
    const std::vector<std::pair<std::string, std::shared_ptr<Parameter>>>& parameters() const noexcept { return params_; }
    // Every module below (itself first, name "") and every parameter, with qualified names.
    std::vector<std::pair<std::string, Module*>> named_modules();
    std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> named_parameters() const;
    // Replace the module at a qualified name (fp8kit::Error if there is none).
    void replace(const std::string& qualified_name, std::shared_ptr<Module> m);

    // Bytes this module (not its children) keeps from forward for backward.
    virtual size_t saved_bytes() const { return 0; }
    // Once per optimizer step (delayed scaling rolls its amax history).
    virtual void on_step() {}
    // Moves every parameter of this module and of those below it (value, grad, an FP8-stored copy)
    // to `device`, and the state a module keeps between steps (a Float8Linear's delayed scaling);
    // inputs then go to forward on that device. All is copied before anything is replaced: a failed
    // move (no GPU) leaves the module as it was. Between steps only: what a forward saved for its
    // backward is not moved.
    void to(Device device);

protected:
    // This module's own state besides its parameters, moved by to() (none by default).
    virtual void state_to(Device) {}

    template <class M>
    std::shared_ptr<M> add_child(std::string name, std::shared_ptr<M> m) {
        children_.emplace_back(std::move(name), m);
        return m;
    }
    std::shared_ptr<Parameter> add_parameter(std::string name, Shape shape);
    // The i-th child as M (fp8kit::Error naming the kind if it is not one).
    template <class M>
    M& child(size_t i) const {
        auto* m = dynamic_cast<M*>(children_.at(i).second.get());
        if (!m) throw Error("fp8kit::nn: child " + quote_printable(children_.at(i).first) + " has the wrong kind");
        return *m;
    }

private:
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
    std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> params_;
};

// The precision of a Linear's three GEMMs when not in FP8: float32, or bf16 emulated (both GEMM
// inputs rounded to bf16, nearest even; float32 accumulation).
enum class MatmulPrecision : uint8_t { f32, bf16 };

// y[..., out] = x[..., in] W[out, in]^T + b. forward keeps x for backward; backward returns dx
// and accumulates dW, db.
class Linear : public Module {
public:
    Linear(int64_t in_features, int64_t out_features, bool bias = true);
    std::string_view kind() const override { return "Linear"; }
    int64_t in_features() const noexcept { return in_; }
    int64_t out_features() const noexcept { return out_; }
    Parameter& weight() const { return *weight_; }
    Parameter* bias() const { return bias_.get(); }
    MatmulPrecision precision = MatmulPrecision::f32;
    // With an FP8-stored weight (layerwise casting, an FP8 checkpoint): x cast to FP8 inside the
    // GEMM (input_quantization), or when false, weight-only - x not quantized but taken as two
    // bf16 terms, hi + lo (fp8kit::GemmA; Diffusers' and torchao Float8WeightOnlyConfig's numerics).
    bool quantize_input = true;

    virtual Tensor forward(const Tensor& x);
    virtual Tensor backward(const Tensor& dy);
    size_t saved_bytes() const override;

protected:
    Linear(const Linear& src);  // shares src's parameters (for conversion)
    int64_t in_, out_;
    std::shared_ptr<Parameter> weight_, bias_;
    Tensor x_;  // saved for backward
    // weight().stored packed for the GEMM at the first forward that computes on it, and again
    // only if stored is replaced (a PackedWeight holds its source, so a new one has new buffers).
    std::optional<PackedWeight> packed_;
};

class LayerNorm : public Module {
public:
    explicit LayerNorm(int64_t c);
    std::string_view kind() const override { return "LayerNorm"; }
    Tensor forward(const Tensor& x);
    Tensor backward(const Tensor& dy);
    size_t saved_bytes() const override;

private:
    int64_t c_;
    std::shared_ptr<Parameter> weight_, bias_;
    Tensor x_, mean_, rstd_;
};

class RMSNorm : public Module {
public:
    explicit RMSNorm(int64_t c);
    std::string_view kind() const override { return "RMSNorm"; }
    Tensor forward(const Tensor& x);
    Tensor backward(const Tensor& dy);
    size_t saved_bytes() const override;

private:
    int64_t c_;
    std::shared_ptr<Parameter> weight_;
    Tensor x_, rstd_;
};

class GELU : public Module {
public:
    std::string_view kind() const override { return "GELU"; }
    Tensor forward(const Tensor& x);
    Tensor backward(const Tensor& dy);
    size_t saved_bytes() const override { return x_.defined() ? x_.nbytes() : 0; }

private:
    Tensor x_;
};

class Embedding : public Module {
public:
    Embedding(int64_t num, int64_t dim);
    std::string_view kind() const override { return "Embedding"; }
    Parameter& weight() const { return *weight_; }
    Tensor forward(const Tensor& ids);  // i32 [...] -> f32 [..., dim]; ids in [0, num)
    void backward(const Tensor& dy);    // accumulates into the weight's grad
    size_t saved_bytes() const override { return ids_.defined() ? ids_.nbytes() : 0; }

private:
    int64_t dim_;
    std::shared_ptr<Parameter> weight_;
    Tensor ids_;
};

// x [B, T, C] -> qkv (Linear C -> 3C) -> causal softmax attention per head -> proj (Linear C -> C).
class CausalSelfAttention : public Module {
public:
    CausalSelfAttention(int64_t c, int64_t heads);
    std::string_view kind() const override { return "CausalSelfAttention"; }
    Tensor forward(const Tensor& x);
    Tensor backward(const Tensor& dy);
    size_t saved_bytes() const override;

private:
    int64_t c_, heads_;
    Tensor qkv_, att_;
};

// Mean softmax cross-entropy of logits [N, V] against targets i32 [N]; keeps the probabilities,
// and backward() gives dlogits of the mean.
class CrossEntropy {
public:
    float forward(const Tensor& logits, const Tensor& targets);
    Tensor backward() const;
    size_t saved_bytes() const { return probs_.defined() ? probs_.nbytes() : 0; }

private:
    Tensor probs_, targets_;
};

// AdamW (decoupled weight decay, Loshchilov & Hutter; torch.optim.AdamW's update) on float32
// parameters, which are the master weights. Decay applies to parameters of rank >= 2 only.
struct AdamWOptions {
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};
class AdamW {
public:
    AdamW(std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> params, AdamWOptions opts);
    void step(float lr);  // one update with this learning rate; grads untouched
    size_t state_bytes() const;

private:
    std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> params_;
    std::vector<Tensor> m_, v_;  // first and second moments, one per parameter
    AdamWOptions opts_;
    int64_t t_ = 0;
};

// ---- FP8 training ----

// What Float8Linear keeps from forward for backward: the FP8 casts (x^T and W^T as quantized in
// forward: one byte per element plus scales), or x in float32 (quantized again in backward).
enum class SaveForBackward : uint8_t { fp8, high_precision };

struct Float8LinearOptions {
    Recipe recipe = Recipe::tensorwise();
    // Which of the three GEMMs run in FP8 (the others in float32): output y = x W^T,
    // grad_input dX = dY W, grad_weight dW = dY^T X. torchao's "rowwise_with_gw_hp" is rowwise with
    // grad_weight = false.
    bool fp8_output = true, fp8_grad_input = true, fp8_grad_weight = true;
    SaveForBackward save = SaveForBackward::fp8;
    void validate() const;
};

class Float8Linear : public Linear {
public:
    Float8Linear(const Linear& src, Float8LinearOptions opts);  // shares src's parameters
    std::string_view kind() const override { return "Float8Linear"; }
    const Float8LinearOptions& options() const noexcept { return opts_; }
    Tensor forward(const Tensor& x) override;
    Tensor backward(const Tensor& dy) override;
    size_t saved_bytes() const override;
    void on_step() override;

protected:
    void state_to(Device device) override;

private:
    QTensor quantize_operand(const Tensor& t, Role role, bool transpose);
    Float8LinearOptions opts_;
    std::optional<DelayedScaling> delayed_x_, delayed_w_, delayed_dy_;
    std::optional<QTensor> qx_t_, qw_t_;  // saved FP8 casts (x^T [in, N], W^T [in, out])
    int64_t rows_ = 0;                    // N of the last forward (0: none pending)
};

// The break-even of FP8 Linear layers on this machine, measured once per process at first use
// (about 0.1 s: square layers d = 64 ... 1024, 256 rows, forward + backward, float32 against a
// tensorwise Float8Linear): the auto filter converts a Linear [out, in] when in >= min_in and
// out >= min_out. reason holds the timings behind the numbers.
struct AutoFilterThresholds {
    int64_t min_in = 0, min_out = 0;
    std::string reason;  // where the numbers come from
};
AutoFilterThresholds auto_filter_thresholds();

using LinearFilter = std::function<bool(const Linear&, const std::string& qualified_name, std::string& why_not)>;
LinearFilter default_filter();  // refuses in or out not a multiple of 16
LinearFilter auto_filter();     // default_filter, and skips shapes where FP8 does not pay

struct ConversionReport {
    std::vector<std::string> converted;
    std::vector<std::pair<std::string, std::string>> skipped;  // name, why
    std::string text() const;
};
// Every Linear the filter passes becomes a Float8Linear with opts.
ConversionReport convert_to_float8_training(Module& model, const LinearFilter& filter, const Float8LinearOptions& opts);

// A per-layer plan: the options to convert this Linear with, or std::nullopt to skip it
// (why_not says why). Layers can then differ in recipe, as a policy file's do.
using LinearPlan =
    std::function<std::optional<Float8LinearOptions>(const Linear&, const std::string& qualified_name, std::string& why_not)>;
ConversionReport convert_to_float8_training(Module& model, const LinearPlan& plan);
// The plan of a policy file (fp8kit/checkpoint.hpp; written by `fp8kit advise`). A Linear's entry
// is Policy::find("<name>.weight", [out, in]): fp8 false skips it with "policy: <reason>"; fp8
// true converts it with the entry's recipe (the other options from `defaults`), whatever its
// shape - the policy measured it. Linears without an entry go to `unmatched` (skipped if it
// refuses) with `defaults`.
LinearPlan policy_plan(const Policy& policy, const Float8LinearOptions& defaults = {},
                       const LinearFilter& unmatched = default_filter());

// ---- layerwise casting (FP8 storage, upcast per layer) ----

struct LayerwiseCastingOptions {
    Format storage = Format::e4m3fn;
    bool scaled = true;  // a per-tensor scale (fp8_max / amax); false: stored unscaled (scale 1)
    std::vector<std::string> skip_patterns = {"pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$"};
    std::vector<std::string> skip_classes;  // module kinds, e.g. "Embedding"
    // A policy file (fp8kit/checkpoint.hpp), for modules the skip rules leave: the entry of a
    // module's "<name>.weight" and its shape (Policy::find) skips it when fp8 is false (with the
    // policy's reason) and stores its weight with the recipe's layout when true (tensorwise:
    // tensor, rowwise: a scale per row, block: 128x128, mxfp8: 1x32 e8m0; other parameters tensor
    // scaling); modules without an entry are cast as without a policy. Needs scaled storage.
    std::optional<Policy> policy;
    // The Linear layers that compute on their FP8 weight: x cast to FP8 (true), or weight-only
    // (false: x not quantized, as Diffusers computes in compute_dtype; Linear::quantize_input).
    bool quantize_input = true;
};
struct LayerwiseCastingReport {
    std::vector<std::string> cast, native;  // upcast per forward / computed in FP8 directly
    std::vector<std::pair<std::string, std::string>> skipped;  // module, why
    size_t bytes_before = 0, bytes_after = 0;  // all parameters of the model
    std::string text() const;
};
// Whether a module kind can compute with an FP8 weight directly on the active backend (Linear:
// fp8kit::gemm takes the FP8 weight), so it skips the upcast.
bool computes_natively_in_fp8(std::string_view kind);
// How x is quantized when a Linear computes with an FP8-stored weight directly: e4m3fn, with
// scale groups along K that nest with the weight's (tensor with tensor, row with row, 1 x c with
// r x c blocks, mx32 with mx32); std::nullopt for column scaling (the weight is then upcast).
std::optional<QuantizeOptions> input_quantization(const QTensor& weight);
// Stores the weights of every module not skipped in FP8; the model becomes inference-only
// (backward through a cast module throws fp8kit::Error).
LayerwiseCastingReport enable_layerwise_casting(Module& model, const LayerwiseCastingOptions& opts = {});

// ---- parameter files ----

// A safetensors file with every parameter of `model` as float32 under its qualified name
// ("blocks.0.attn.qkv.weight"; a weight stored in FP8 dequantized) and `metadata` as its
// __metadata__ (what a caller needs to rebuild the module: the GPT app writes its shape). Written
// through a temporary renamed over `path`: never half-written.
void save_parameters(const Module& model, const std::string& path, const std::map<std::string, std::string>& metadata);
// Fills every parameter of `model` from `file` (a safetensors file or a directory of shards):
// what save_parameters writes, or that file quantized by `fp8kit quantize` (any scheme). A Linear
// weight stored in FP8 becomes its Parameter::stored (the model is then inference-only, as with
// layerwise casting; Linear::forward computes with it directly, input_quantization), another FP8
// tensor is dequantized; every tensor is copied out of the file. fp8kit::Error naming the file
// and the problem for a missing tensor, a wrong shape or dtype, an unexpected tensor.
void load_parameters(Module& model, const Checkpoint& file);

}  // namespace fp8kit::nn
