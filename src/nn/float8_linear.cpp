// src/nn/float8_linear.cpp: Float8Linear - a Linear whose three GEMMs run through fp8kit::gemm
// (TN layout: B is [N, K]) with a Recipe, as TransformerEngine's te.Linear / torchao's
// Float8Linear:
//   output       y[N, out]  = x[N, in] . W[out, in]^T     A = q(x),    B = q(W)
//   grad_input   dX[N, in]  = dY[N, out] . W[out, in]     A = q(dY),   B = q(W^T) [in, out]
//   grad_weight  dW[out, in] = dY^T[out, N] . x[N, in]    A = q(dY^T), B = q(x^T) [in, N]
// The transposed operands are quantize's transposed copies (QTensor::transposed(): exactly
// quantize(t^T) with the same options, so rowwise / block scales run along each GEMM's K).
// Formats per Recipe::options(Role): e4m3fn x and W, e5m2 dY for tensorwise / delayed ("hybrid").
// Checked against the float64 layer (SQNR floors of docs/NUMERICS.md) in tests/nn/test_float8_linear.cpp.
#include "fp8kit/nn.hpp"
#include "fp8kit/ops.hpp"

namespace fp8kit::nn {

void Float8LinearOptions::validate() const {
    recipe.validate();
    if (!fp8_output && !fp8_grad_input && !fp8_grad_weight)
        throw Error("fp8kit::nn::Float8LinearOptions: no GEMM in FP8 (fp8_output, fp8_grad_input and fp8_grad_weight are all false)");
}

Float8Linear::Float8Linear(const Linear& src, Float8LinearOptions opts) : Linear(src), opts_(std::move(opts)) {
    opts_.validate();
    if (opts_.recipe.kind == RecipeKind::delayed) {  // the state lives where the weight does
        const Device dev = weight_->value.defined() ? weight_->value.device() : Device::cpu;
        delayed_x_.emplace(opts_.recipe, Role::input, dev);
        delayed_w_.emplace(opts_.recipe, Role::weight, dev);
        delayed_dy_.emplace(opts_.recipe, Role::grad_output, dev);
    }
}

QTensor Float8Linear::quantize_operand(const Tensor& t, Role role, bool transpose) {
    if (opts_.recipe.kind == RecipeKind::delayed) {
        DelayedScaling& d = role == Role::input ? *delayed_x_ : role == Role::weight ? *delayed_w_ : *delayed_dy_;
        // Before its first step a DelayedScaling has no history and scale 1 (TransformerEngine's
        // initial state): gradients of ~1e-5 would then flush to zero in e5m2, and Adam turns
        // what survives into full-size steps. As torchao's Float8Linear does, the first use
        // records this tensor's amax and derives the scale from it (a throwaway cast, then step()).
        if (d.fresh()) {
            d.quantize(t);
            d.step();
        }
        return d.quantize(t, transpose);
    }
    QuantizeOptions o = opts_.recipe.options(role);
    o.transpose = transpose;
    return quantize(t, o);
}

Tensor Float8Linear::forward(const Tensor& x) {
    if (x.dtype() != DType::f32 || x.dim() < 1 || x.size(-1) != in_)
        throw Error("fp8kit::nn::Float8Linear::forward: x is " + std::string(to_string(x.dtype())) + " " +
                    to_string(x.shape()) + ", expected f32 [..., " + std::to_string(in_) + "]");
    if (!weight_->value.defined()) throw Error("fp8kit::nn::Float8Linear: the weight is stored in FP8 (layerwise casting)");
    const Tensor x2 = x.contiguous().reshape({-1, in_});
    const bool save_fp8 = opts_.save == SaveForBackward::fp8;
    Shape yshape = x.shape();
    yshape.back() = out_;
    Tensor y;
    qx_t_.reset();
    qw_t_.reset();
    x_ = Tensor();
    if (opts_.fp8_output) {
        const QTensor qx = quantize_operand(x2, Role::input, save_fp8 && opts_.fp8_grad_weight);
        const QTensor qw = quantize_operand(weight_->value, Role::weight, save_fp8 && opts_.fp8_grad_input);
        GemmOptions go;
        if (bias_) go.bias = bias_->value;
        y = gemm(qx, PackedWeight(qw), go);
        // Keep only the transposed copies: the forward codes are freed with qx, qw.
        if (qx.has_transpose()) qx_t_ = qx.transposed();
        if (qw.has_transpose()) qw_t_ = qw.transposed();
    } else {
        y = Tensor::empty({x2.size(0), out_}, DType::f32, x2.device());
        linear_forward(y, x2, weight_->value, bias_ ? bias_->value : Tensor());
    }
    if (save_fp8 && opts_.fp8_grad_weight && !qx_t_) qx_t_ = quantize_operand(x2, Role::input, true).transposed();
    if (save_fp8 && opts_.fp8_grad_input && !qw_t_) qw_t_ = quantize_operand(weight_->value, Role::weight, true).transposed();
    if (!save_fp8 || !opts_.fp8_grad_weight) x_ = x2;  // needed in float32
    rows_ = x2.size(0);
    return y.reshape(yshape);
}

Tensor Float8Linear::backward(const Tensor& dy) {
    if (rows_ == 0) throw Error("fp8kit::nn::Float8Linear::backward: no forward to go back through");
    if (dy.dtype() != DType::f32 || dy.numel() != rows_ * out_ || dy.size(-1) != out_)
        throw Error("fp8kit::nn::Float8Linear::backward: dy is " + to_string(dy.shape()) + ", expected [" +
                    std::to_string(rows_) + " rows, " + std::to_string(out_) + "]");
    const Tensor d2 = dy.contiguous().reshape({rows_, out_});
    Tensor dx;
    std::optional<QTensor> qdy;
    if (opts_.fp8_grad_input || opts_.fp8_grad_weight)
        qdy = quantize_operand(d2, Role::grad_output, opts_.fp8_grad_weight);
    if (opts_.fp8_grad_input) {
        // dX = q(dY) . q(W^T)^T
        const QTensor wt = qw_t_ ? *qw_t_ : quantize_operand(weight_->value, Role::weight, true).transposed();
        dx = gemm(*qdy, PackedWeight(wt));
    } else {
        dx = Tensor::empty({rows_, in_}, DType::f32, d2.device());
        matmul(dx, d2, weight_->value);
    }
    if (opts_.fp8_grad_weight) {
        // dW += q(dY^T) . q(x^T)^T: accumulated by the GEMM into the gradient (beta = 1)
        const QTensor xt = qx_t_ ? *qx_t_ : quantize_operand(x_, Role::input, true).transposed();
        GemmOptions accumulate;
        accumulate.beta = 1.0f;
        gemm(qdy->transposed(), PackedWeight(xt), accumulate, weight_->grad);
    } else {
        matmul(weight_->grad, d2, x_, {.transpose_a = true, .accumulate = true});
    }
    if (bias_) bias_backward(bias_->grad, d2);
    qx_t_.reset();
    qw_t_.reset();
    x_ = Tensor();
    rows_ = 0;
    Shape xs = dy.shape();
    xs.back() = in_;
    return dx.reshape(xs);
}

size_t Float8Linear::saved_bytes() const {
    size_t s = x_.defined() ? x_.nbytes() : 0;
    for (const auto* q : {&qx_t_, &qw_t_})
        if (*q) s += (*q)->data.nbytes() + (*q)->scale_inv.nbytes();
    return s;
}

void Float8Linear::state_to(Device device) {
    for (auto* d : {&delayed_x_, &delayed_w_, &delayed_dy_}) {
        if (*d) *d = (*d)->to(device);
    }
}

void Float8Linear::on_step() {
    if (!delayed_x_) return;
    delayed_x_->step();
    delayed_w_->step();
    delayed_dy_->step();
}

}  // namespace fp8kit::nn
