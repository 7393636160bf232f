// src/nn/linear.cpp: the Linear module (float32, or bf16-emulated GEMM inputs, on the public ops
// linear_forward / linear_backward of <fp8kit/ops.hpp>; or an FP8-stored weight - layerwise
// casting, an FP8 checkpoint - used directly by fp8kit::gemm with x quantized to match,
// input_quantization, or weight-only when quantize_input is false). Checked against PyTorch (tests/nn/test_torch_gpt.cpp); the ops by
// tests/ops/test_matmul.cpp and tests/ops/test_backward.cpp.
#include <cmath>
#include <optional>
#include <vector>

#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {
namespace {

// bf16 emulation: a copy with every element rounded to bf16 (nearest even) and back, exactly
// what a bf16 GEMM input holds; the GEMM then accumulates in float32.
Tensor round_bf16(const Tensor& t) {
    if (t.device() != Device::cpu)
        throw Error("fp8kit::nn::Linear: MatmulPrecision::bf16 runs on the host only (a tensor is on " +
                    std::string(to_string(t.device())) + ")");
    Tensor r = Tensor::empty(t.shape(), DType::f32);
    const float* s = t.data<float>();
    float* d = r.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = float(bf16(s[i]));
    return r;
}

}  // namespace

std::optional<QuantizeOptions> input_quantization(const QTensor& weight) {
    // fp8kit::gemm scales each partial sum over a K group by the two operands' scales, so x needs
    // scale groups along K that nest with the weight's: tensor with tensor; one scale per row of
    // x with one per output channel (torchao rowwise); 1 x c groups with r x c weight blocks
    // (DeepSeek-V3: 1x128 activations, 128x128 weights); 1x32 e8m0 with 1x32 (MX). A column-
    // scaled weight has a scale per element of K, which no partial sum can carry: none.
    // x is e4m3fn, the forward format of every recipe: it keeps a mantissa bit more than e5m2,
    // and an e5m2 weight with an e5m2 input would be two 5-bit-exponent operands, which the GEMM
    // refuses (as cuBLASLt does).
    QuantizeOptions q;
    q.format = Format::e4m3fn;
    switch (weight.scaling.granularity) {
        case Granularity::tensor: q.scaling = Scaling::tensor(); break;
        case Granularity::row: q.scaling = Scaling::row(); break;
        case Granularity::block: q.scaling = Scaling::block(1, weight.scaling.block_cols); break;
        case Granularity::mx32: q.scaling = Scaling::mx32(); break;
        case Granularity::column: return std::nullopt;
    }
    return q;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias) : in_(in_features), out_(out_features) {
    if (in_features < 1 || out_features < 1)
        throw Error("fp8kit::nn::Linear: features must be >= 1, got in " + std::to_string(in_features) + ", out " +
                    std::to_string(out_features));
    weight_ = add_parameter("weight", {out_features, in_features});
    if (bias) bias_ = add_parameter("bias", {out_features});
}

Linear::Linear(const Linear& src)
    : Module(src), precision(src.precision), quantize_input(src.quantize_input), in_(src.in_), out_(src.out_),
      weight_(src.weight_), bias_(src.bias_) {}

// Checks x [..., in] (f32, contiguous) and returns it as [N, in].
static Tensor as_rows(const Tensor& x, int64_t in, const char* who) {
    if (x.dtype() != DType::f32 || x.dim() < 1 || x.size(-1) != in)
        throw Error(std::string(who) + ": x is " + std::string(to_string(x.dtype())) + " " + to_string(x.shape()) +
                    ", expected f32 [..., " + std::to_string(in) + "]");
    return x.contiguous().reshape({-1, in});
}

Tensor Linear::forward(const Tensor& x) {
    const Tensor x2 = as_rows(x, in_, "fp8kit::nn::Linear::forward");
    Shape yshape = x.shape();
    yshape.back() = out_;
    const Parameter& w = *weight_;
    if (w.stored && computes_natively_in_fp8(kind())) {
        if (const auto qo = input_quantization(*w.stored)) {
            // An FP8-stored weight (layerwise casting, an FP8 checkpoint) goes to the GEMM as is;
            // x is cast inside it with the matching scaling, or weight-only not quantized.
            GemmOptions go;
            if (bias_) go.bias = bias_->compute_value();
            x_ = Tensor();
            const QTensor& s = *w.stored;
            if (!packed_ || packed_->source().data.const_raw_data() != s.data.const_raw_data() ||
                packed_->source().scale_inv.const_raw_data() != s.scale_inv.const_raw_data()) {
                packed_.emplace(s);  // packed once, not per call (a decode step is mostly this GEMM)
            }
            return gemm(quantize_input ? GemmA(x2, *qo) : GemmA(x2), *packed_, go).reshape(yshape);
        }
    }
    const Tensor wv = w.compute_value();  // upcast, for this call only, when stored in FP8
    const Tensor xc = precision == MatmulPrecision::bf16 ? round_bf16(x2) : x2;
    const Tensor wc = precision == MatmulPrecision::bf16 ? round_bf16(wv) : wv;
    x_ = w.stored ? Tensor() : xc;  // FP8-stored weights: inference only
    Tensor y = Tensor::empty({x2.size(0), out_}, DType::f32, x2.device());
    const Tensor b = bias_ ? bias_->compute_value() : Tensor();
    linear_forward(y, xc, wc, b);
    return y.reshape(yshape);
}

Tensor Linear::backward(const Tensor& dy) {
    if (!x_.defined()) throw Error("fp8kit::nn::Linear::backward: no forward to go back through (or weights stored in FP8)");
    const Tensor d2 = as_rows(dy, out_, "fp8kit::nn::Linear::backward");
    if (d2.size(0) != x_.size(0))
        throw Error("fp8kit::nn::Linear::backward: dy has " + std::to_string(d2.size(0)) + " rows, forward had " +
                    std::to_string(x_.size(0)));
    const Tensor dc = precision == MatmulPrecision::bf16 ? round_bf16(d2) : d2;
    const Tensor wc = precision == MatmulPrecision::bf16 ? round_bf16(weight_->value) : weight_->value;
    Tensor dx = Tensor::empty({d2.size(0), in_}, DType::f32, d2.device());
    linear_backward(dx, weight_->grad, bias_ ? bias_->grad : Tensor(), dc, x_, wc);
    x_ = Tensor();
    Shape xs = dy.shape();
    xs.back() = in_;
    return dx.reshape(xs);
}

size_t Linear::saved_bytes() const { return x_.defined() ? x_.nbytes() : 0; }

}  // namespace fp8kit::nn
