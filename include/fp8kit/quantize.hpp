// fp8kit/quantize.hpp: quantized tensors (FP8 codes + the scales that bring them back) and the
// cast operations: amax, quantize, dequantize, cast_transpose.
//
// Semantics (docs/NUMERICS.md): for each scaling group, scale = compute_scale(amax of the group)
// (or the MX rule for mx32), code = encode(float32(x * scale)), and the stored
// scale_inv = 1 / scale is what dequantization and GEMMs multiply by:
//     dequantized = decode(code) * scale_inv[group]
// Every backend gives the same codes and scales bit for bit (tests/ops/test_quantize.cpp checks
// the fast backends against ref).
//
// Non-finite inputs: amax is NaN if any element is NaN, else Inf if any is +-Inf. Such a group
// gets scale 1 (mx32: the NaN scale 0xff), so NaN inputs stay NaN codes and the recorded amax
// shows it; nothing becomes a finite number except Inf under Overflow::saturate (asked for by
// the caller). With NonFinite::error quantize throws fp8kit::Error instead.
#pragma once

#include <optional>

#include "fp8kit/format.hpp"
#include "fp8kit/scaling.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit {

enum class NonFinite : uint8_t { propagate, error };

struct QuantizeOptions {
    Format format = Format::e4m3fn;       // e4m3fn, e5m2, e4m3fnuz or e5m2fnuz
    Scaling scaling = Scaling::tensor();
    Overflow overflow = Overflow::saturate;  // mx32 always saturates (the MX spec's encoding)
    bool power_of_two = false;            // scales rounded down to 2^k (exact scaling)
    float amax_epsilon = 0.0f;            // amax below this counts as this (0: off)
    MxRounding mx_rounding = MxRounding::floor;  // mx32 only
    NonFinite non_finite = NonFinite::propagate;
    // Tensor scaling only: use this scale instead of fp8_max / amax (delayed scaling). amax is
    // still measured, in the same pass as the cast.
    std::optional<float> scale;
    // Also produce the transposed copy (what cast_transpose does).
    bool transpose = false;
};

struct QTensor {
    Tensor data;        // FP8 codes, dtype = format, the shape of the input
    Format format = Format::e4m3fn;
    Scaling scaling;
    Tensor scale_inv;   // [scale_shape(rows, cols)]: f32, or e8m0fnu for mx32
    std::optional<float> amax;  // max |x| over the whole input, when known
    // Optional transposed copy, for the backward GEMMs: exactly quantize(x^T) with the same
    // options, i.e. codes [cols, rows] with scale_inv_t [scale_shape(cols, rows)].
    Tensor data_t, scale_inv_t;

    int64_t rows() const;  // the matrix view: [numel / last dim, last dim]
    int64_t cols() const;
    bool has_transpose() const noexcept { return data_t.defined(); }
    QTensor transposed() const;  // the transposed copy as a QTensor of its own (Error if none)
};

float amax(const Tensor& x);                       // max |x|; NaN if any NaN; 0 if empty
Tensor amax(const Tensor& x, const Scaling& s);    // per group, f32 [scale_shape]
QTensor quantize(const Tensor& x, const QuantizeOptions& opts = {});
// The same, into `out`: its buffers are reused where their dtype and shape fit (and replaced
// where not), so a training loop that quantizes the same shapes every step allocates nothing -
// a fresh large output costs a page fault per 4 KiB on first touch. Returns out.
QTensor& quantize(const Tensor& x, const QuantizeOptions& opts, QTensor& out);
QTensor cast_transpose(const Tensor& x, QuantizeOptions opts = {});  // quantize with transpose
Tensor dequantize(const QTensor& q, DType out = DType::f32);          // f32, bf16 or f16

// ---- for backends: the options resolved into what turns a group's amax into its scale ----
struct ScaleRule {
    Format format;
    bool mx;
    MxRounding mx_rounding;
    float fp8_max;
    float amax_epsilon;
    bool power_of_two;
    bool fixed;          // delayed scaling: fixed_scale for every group
    float fixed_scale;
};
ScaleRule scale_rule(const QuantizeOptions& opts);

struct GroupScale {
    float scale;      // what x is multiplied by before encoding
    float scale_inv;  // what is stored (f32 scales)
    uint8_t e8m0;     // what is stored (mx32)
};
FP8KIT_HD constexpr GroupScale group_scale(float amax, const ScaleRule& r) noexcept {
    if (r.mx) {
        const uint8_t code = mx_scale_code(amax, r.format, r.mx_rounding);
        return {mx_quantize_multiplier(code), decode(code, Format::e8m0fnu), code};
    }
    const float scale = r.fixed ? r.fixed_scale
                                : compute_scale(amax, r.fp8_max, r.amax_epsilon, r.power_of_two);
    return {scale, 1.0f / scale, 0};
}

}  // namespace fp8kit
