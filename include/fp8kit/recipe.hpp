// fp8kit/recipe.hpp: scaling recipes - which format and granularity each GEMM operand is
// quantized with - and the per-tensor state of delayed scaling.
//
// Defaults are those of docs/NUMERICS.md ("Recipes"):
//   tensorwise  e4m3fn forward, e5m2 gradients ("hybrid"), one scale per tensor, current amax
//   delayed     the same formats, one scale per tensor from an amax history
//   rowwise     e4m3fn throughout, one power-of-two scale per row of each GEMM operand
//   block       e4m3fn throughout, activations and gradients 1x128, weights 128x128
//   mxfp8       e4m3fn throughout (e5m2 gradients optional), 1x32 blocks with e8m0 scales, the
//               MX spec's shared exponent (MxRounding::floor); parse_recipe's "mxfp8_rceil" is
//               the same with MxRounding::up (torchao's RCEIL, TransformerEngine's rule)
// Pure e5m2 training (e5m2 forward) is refused: its 2 mantissa bits lose the forward pass.
#pragma once

#include <string_view>
#include <vector>

#include "fp8kit/quantize.hpp"

namespace fp8kit {

enum class RecipeKind : uint8_t { tensorwise, delayed, rowwise, block, mxfp8 };
enum class Role : uint8_t { input, weight, grad_output };  // the operands of a Linear's GEMMs
enum class AmaxCompute : uint8_t { max, most_recent };     // delayed: amax from the history

struct Recipe {
    RecipeKind kind = RecipeKind::tensorwise;
    Format forward = Format::e4m3fn;   // inputs and weights
    Format backward = Format::e5m2;    // gradients
    Overflow overflow = Overflow::saturate;
    bool power_of_two = false;
    float amax_epsilon = 0.0f;
    // delayed
    int history_length = 1024;
    AmaxCompute amax_compute = AmaxCompute::max;
    int margin = 0;                    // scale = (fp8_max * 2^-margin) / amax
    // block: activations 1 x block_size, weights block_size x block_size
    int64_t block_size = 128;
    // mxfp8
    MxRounding mx_rounding = MxRounding::floor;

    static Recipe tensorwise();
    static Recipe delayed(int history_length = 1024, AmaxCompute compute = AmaxCompute::max, int margin = 0);
    static Recipe rowwise();
    static Recipe block(int64_t block_size = 128);
    static Recipe mxfp8(Format grad = Format::e4m3fn);

    // fp8kit::Error naming the field: e5m2 forward, a non-FP8 or e8m0 format, history_length or
    // block_size < 1, margin < 0, a negative or NaN epsilon.
    void validate() const;
    // The quantization of one operand (delayed: without the scale, which DelayedScaling holds).
    QuantizeOptions options(Role role) const;
};

std::string_view to_string(RecipeKind k) noexcept;  // "tensorwise", "delayed", "rowwise", "block", "mxfp8"
Recipe parse_recipe(std::string_view name);         // the defaults of that kind, or mxfp8_rceil; fp8kit::Error otherwise

// Delayed scaling state of one tensor (TransformerEngine's DelayedScaling): quantize() uses the
// scale derived from earlier steps and records this step's amax; step() - once per training
// step - derives the next scale from the history and rolls it. A history whose amax is 0, NaN or
// Inf keeps the previous scale. The history and the scale are tensors on the state's device, and
// both updates run there: a training step never reads them back to the host.
class DelayedScaling {
public:
    // recipe.kind must be delayed; tensors quantized with this state must live on `device`.
    DelayedScaling(const Recipe& recipe, Role role, Device device = Device::cpu);

    const Tensor& scale() const noexcept { return scale_; }               // [1] f32
    const Tensor& amax_history() const noexcept { return history_; }      // [history_length] f32, [0]: this step
    // No amax recorded and no step taken yet (the state TransformerEngine starts from: scale 1).
    bool fresh() const noexcept { return fresh_; }

    QTensor quantize(const Tensor& x, bool transpose = false);
    void step();
    // This state (history, scale, freshness) on `device`.
    DelayedScaling to(Device device) const;
    // A state amax_history(), scale() and fresh() read (a checkpoint's) put back, copied to this
    // state's device: fp8kit::Error naming the argument for a history of another length or dtype,
    // an amax below zero, or a scale that is not one finite positive f32.
    void restore(const Tensor& amax_history, const Tensor& scale, bool fresh);

private:
    Recipe recipe_;
    QuantizeOptions options_;
    Tensor history_, scale_;
    bool fresh_ = true;
};

}  // namespace fp8kit
