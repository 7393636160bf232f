// src/nn/layernorm.cpp: layernorm_* and rmsnorm_* forward/backward (as torch.nn.LayerNorm and
// torch.nn.RMSNorm with eps 1e-5) and the LayerNorm / RMSNorm modules. Row statistics are summed
// in double whatever T is, so float32 results stay within a few float32 roundings of PyTorch's.
// Checked against central finite differences in float64 (tests/nn/test_ops.cpp) and PyTorch
// (tests/nn/test_torch_gpt.cpp).
#include <cmath>

#include "fp8kit/nn.hpp"
#include "nn/ops.hpp"

namespace fp8kit::nn {
namespace ops {

constexpr double norm_eps = 1e-5;

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static) if (rows * c > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* x = inp + r * c;  // [C]
        double s = 0.0;
        for (int64_t i = 0; i < c; ++i) s += double(x[i]);
        const double m = s / double(c);
        double v = 0.0;
        for (int64_t i = 0; i < c; ++i) v += (double(x[i]) - m) * (double(x[i]) - m);
        const double rs = 1.0 / std::sqrt(v / double(c) + norm_eps);
        for (int64_t i = 0; i < c; ++i) out[r * c + i] = T((double(x[i]) - m) * rs) * weight[i] + bias[i];
        mean[r] = T(m);
        rstd[r] = T(rs);
    }
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int64_t rows, int64_t c) {
    // dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * weight
#pragma omp parallel for schedule(static) if (rows * c > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* x = inp + r * c;
        const T* g = dout + r * c;
        double dm = 0.0, dnm = 0.0;
        for (int64_t i = 0; i < c; ++i) {
            const double norm = (double(x[i]) - double(mean[r])) * double(rstd[r]);
            const double dn = double(g[i]) * double(weight[i]);
            dm += dn;
            dnm += dn * norm;
        }
        dm /= double(c);
        dnm /= double(c);
        for (int64_t i = 0; i < c; ++i) {
            const double norm = (double(x[i]) - double(mean[r])) * double(rstd[r]);
            dinp[r * c + i] = T((double(g[i]) * double(weight[i]) - dm - norm * dnm) * double(rstd[r]));
        }
    }
    // Parameter gradients: rows summed in order (one thread), so the result is reproducible.
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < c; ++i) {
            const T norm = (inp[r * c + i] - mean[r]) * rstd[r];
            dweight[i] += dout[r * c + i] * norm;
            dbias[i] += dout[r * c + i];
        }
}

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t rows, int64_t c) {
#pragma omp parallel for schedule(static) if (rows * c > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* x = inp + r * c;
        double ss = 0.0;
        for (int64_t i = 0; i < c; ++i) ss += double(x[i]) * double(x[i]);
        const double rs = 1.0 / std::sqrt(ss / double(c) + norm_eps);
        for (int64_t i = 0; i < c; ++i) out[r * c + i] = T(double(x[i]) * rs) * weight[i];
        rstd[r] = T(rs);
    }
}

template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t rows,
                      int64_t c) {
    // dx_i = rstd * w_i g_i - rstd^3 x_i / C * sum_j w_j g_j x_j
#pragma omp parallel for schedule(static) if (rows * c > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* x = inp + r * c;
        const T* g = dout + r * c;
        const double rs = double(rstd[r]);
        double dot = 0.0;
        for (int64_t i = 0; i < c; ++i) dot += double(weight[i]) * double(g[i]) * double(x[i]);
        for (int64_t i = 0; i < c; ++i)
            dinp[r * c + i] = T(rs * double(weight[i]) * double(g[i]) - rs * rs * rs * double(x[i]) * dot / double(c));
    }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < c; ++i) dweight[i] += dout[r * c + i] * inp[r * c + i] * rstd[r];
}

template void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int64_t, int64_t);
template void layernorm_forward(double*, double*, double*, const double*, const double*, const double*, int64_t, int64_t);
template void layernorm_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                                 const float*, int64_t, int64_t);
template void layernorm_backward(double*, double*, double*, const double*, const double*, const double*, const double*,
                                 const double*, int64_t, int64_t);
template void rmsnorm_forward(float*, float*, const float*, const float*, int64_t, int64_t);
template void rmsnorm_forward(double*, double*, const double*, const double*, int64_t, int64_t);
template void rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*, int64_t, int64_t);
template void rmsnorm_backward(double*, double*, const double*, const double*, const double*, const double*, int64_t,
                               int64_t);

}  // namespace ops

namespace {
Tensor check_rows(const Tensor& x, int64_t c, const char* who) {
    if (x.dtype() != DType::f32 || x.dim() < 1 || x.size(-1) != c)
        throw Error(std::string(who) + ": x is " + std::string(to_string(x.dtype())) + " " + to_string(x.shape()) +
                    ", expected f32 [..., " + std::to_string(c) + "]");
    return x.contiguous();
}
}  // namespace

LayerNorm::LayerNorm(int64_t c) : c_(c) {
    weight_ = add_parameter("weight", {c});
    bias_ = add_parameter("bias", {c});
    float* w = weight_->value.data<float>();
    for (int64_t i = 0; i < c; ++i) w[i] = 1.0f;
}

Tensor LayerNorm::forward(const Tensor& x) {
    x_ = check_rows(x, c_, "fp8kit::nn::LayerNorm::forward");
    const int64_t rows = x_.numel() / c_;
    Tensor y = Tensor::empty(x_.shape(), DType::f32);
    mean_ = Tensor::empty({rows}, DType::f32);
    rstd_ = Tensor::empty({rows}, DType::f32);
    const Tensor w = weight_->compute_value(), b = bias_->compute_value();
    ops::layernorm_forward(y.data<float>(), mean_.data<float>(), rstd_.data<float>(), x_.data<float>(), w.data<float>(),
                           b.data<float>(), rows, c_);
    return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
    if (!x_.defined() || dy.shape() != x_.shape())
        throw Error("fp8kit::nn::LayerNorm::backward: dy " + to_string(dy.shape()) + " does not match the forward input");
    const Tensor g = dy.contiguous();
    Tensor dx = Tensor::empty(x_.shape(), DType::f32);
    ops::layernorm_backward(dx.data<float>(), weight_->grad.data<float>(), bias_->grad.data<float>(), g.data<float>(),
                            x_.data<float>(), weight_->value.data<float>(), mean_.data<float>(), rstd_.data<float>(),
                            x_.numel() / c_, c_);
    x_ = mean_ = rstd_ = Tensor();
    return dx;
}

size_t LayerNorm::saved_bytes() const { return x_.defined() ? x_.nbytes() + mean_.nbytes() + rstd_.nbytes() : 0; }

RMSNorm::RMSNorm(int64_t c) : c_(c) {
    weight_ = add_parameter("weight", {c});
    float* w = weight_->value.data<float>();
    for (int64_t i = 0; i < c; ++i) w[i] = 1.0f;
}

Tensor RMSNorm::forward(const Tensor& x) {
    x_ = check_rows(x, c_, "fp8kit::nn::RMSNorm::forward");
    const int64_t rows = x_.numel() / c_;
    Tensor y = Tensor::empty(x_.shape(), DType::f32);
    rstd_ = Tensor::empty({rows}, DType::f32);
    const Tensor w = weight_->compute_value();
    ops::rmsnorm_forward(y.data<float>(), rstd_.data<float>(), x_.data<float>(), w.data<float>(), rows, c_);
    return y;
}

Tensor RMSNorm::backward(const Tensor& dy) {
    if (!x_.defined() || dy.shape() != x_.shape())
        throw Error("fp8kit::nn::RMSNorm::backward: dy " + to_string(dy.shape()) + " does not match the forward input");
    const Tensor g = dy.contiguous();
    Tensor dx = Tensor::empty(x_.shape(), DType::f32);
    ops::rmsnorm_backward(dx.data<float>(), weight_->grad.data<float>(), g.data<float>(), x_.data<float>(),
                          weight_->value.data<float>(), rstd_.data<float>(), x_.numel() / c_, c_);
    x_ = rstd_ = Tensor();
    return dx;
}

size_t RMSNorm::saved_bytes() const { return x_.defined() ? x_.nbytes() + rstd_.nbytes() : 0; }

}  // namespace fp8kit::nn
