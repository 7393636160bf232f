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
// Out-of-range and non-finite inputs (docs/NUMERICS.md, "Non-finite values"): a finite value whose
// scaled magnitude exceeds the format's range saturates to +-max (Overflow::saturate, the default,
// as TransformerEngine) or overflows to Inf/NaN (Overflow::nonsaturating). A NaN or Inf input is
// never made finite: with NonFinite::propagate (the default) it becomes the format's NaN code
// (e4m3fn, fnuz formats) or its Inf code (e5m2), its group's scale is 1 (mx32: the NaN scale
// 0xff, so the whole block decodes to NaN), and amax is NaN (any NaN) or Inf. With
// NonFinite::error quantize throws fp8kit::Error naming the tensor and the index of the first
// non-finite element, and writes nothing to `out`.
//
// amax and scales live in tensors on the input's device: nothing here reads them back to the host
// except the float-returning amax(x) convenience.
#pragma once

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
    // Tensor scaling only: use this scale (a one-element f32 tensor on the input's device) instead
    // of fp8_max / amax (delayed scaling). amax is still measured, in the same pass as the cast.
    // Undefined: current scaling.
    Tensor scale;
    // Also produce the transposed copy (what cast_transpose does).
    bool transpose = false;
};

struct QTensor {
    Tensor data;        // FP8 codes, the shape of the input; their dtype is the format
    Scaling scaling;
    Tensor scale_inv;   // [scale_shape(rows, cols)]: f32, or e8m0fnu for mx32
    Tensor amax;        // [1] f32 on data's device: max |x| over the whole input; undefined if unknown
    // Optional transposed copy, for the backward GEMMs: exactly quantize(x^T) with the same
    // options, i.e. codes [cols, rows] with scale_inv_t [scale_shape(cols, rows)].
    Tensor data_t, scale_inv_t;

    Format format() const;  // data's dtype as a Format (fp8kit::Error if data is not FP8)
    int64_t rows() const;  // the matrix view: [numel / last dim, last dim]
    int64_t cols() const;
    bool has_transpose() const noexcept { return data_t.defined(); }
    QTensor transposed() const;  // the transposed copy as a QTensor of its own (Error if none)
    QTensor to(Device device) const;  // every tensor of it on `device` (Tensor::to)
};

float amax(const Tensor& x);                       // max |x| read back to the host; NaN if any NaN; 0 if empty
Tensor amax(const Tensor& x, const Scaling& s);    // per group, f32 [scale_shape]
QTensor quantize(const Tensor& x, const QuantizeOptions& opts = {});
// The same, into `out`: its buffers are reused where their dtype and shape fit (and replaced
// where not), so a training loop that quantizes the same shapes every step allocates nothing -
// a fresh large output costs a page fault per 4 KiB on first touch. Returns out.
QTensor& quantize(const Tensor& x, const QuantizeOptions& opts, QTensor& out);
QTensor cast_transpose(const Tensor& x, QuantizeOptions opts = {});  // quantize with transpose
Tensor dequantize(const QTensor& q, DType out = DType::f32);          // f32, bf16 or f16

}  // namespace fp8kit
