// src/nn/crossentropy.cpp: softmax cross-entropy forward/backward (as
// torch.nn.functional.cross_entropy, mean over rows) and the CrossEntropy loss. Softmax sums in
// double. Checked against central finite differences in float64 and PyTorch (tests/nn/).
#include <cmath>

#include "fp8kit/nn.hpp"
#include "nn/ops.hpp"

namespace fp8kit::nn {
namespace ops {

template <class T>
void crossentropy_forward(T* losses, T* probs, const T* logits, const int32_t* targets, int64_t rows, int64_t v) {
#pragma omp parallel for schedule(static) if (rows * v > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* z = logits + r * v;  // [V]
        double maxv = double(z[0]);
        for (int64_t i = 1; i < v; ++i) maxv = std::max(maxv, double(z[i]));
        double sum = 0.0;
        for (int64_t i = 0; i < v; ++i) sum += std::exp(double(z[i]) - maxv);
        for (int64_t i = 0; i < v; ++i) probs[r * v + i] = T(std::exp(double(z[i]) - maxv) / sum);
        // -log softmax computed from the logits, not from the rounded probability
        losses[r] = T(std::log(sum) - (double(z[targets[r]]) - maxv));
    }
}

template <class T>
void crossentropy_backward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int64_t rows, int64_t v) {
#pragma omp parallel for schedule(static) if (rows * v > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < v; ++i)
            dlogits[r * v + i] = (probs[r * v + i] - (i == targets[r] ? T(1) : T(0))) * dloss;
}

template void crossentropy_forward(float*, float*, const float*, const int32_t*, int64_t, int64_t);
template void crossentropy_forward(double*, double*, const double*, const int32_t*, int64_t, int64_t);
template void crossentropy_backward(float*, const float*, const int32_t*, float, int64_t, int64_t);
template void crossentropy_backward(double*, const double*, const int32_t*, double, int64_t, int64_t);

}  // namespace ops

float CrossEntropy::forward(const Tensor& logits, const Tensor& targets) {
    if (logits.dtype() != DType::f32 || logits.dim() < 1 || targets.dtype() != DType::i32 ||
        targets.numel() * logits.size(-1) != logits.numel())
        throw Error("fp8kit::nn::CrossEntropy: logits " + to_string(logits.shape()) + " and targets " +
                    to_string(targets.shape()) + " (i32) do not match");
    const int64_t v = logits.size(-1), rows = targets.numel();
    targets_ = targets.contiguous();
    const int32_t* tp = targets_.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r)
        if (tp[r] < 0 || tp[r] >= v)
            throw Error("fp8kit::nn::CrossEntropy: target " + std::to_string(tp[r]) + " outside [0, " + std::to_string(v) + ")");
    const Tensor z = logits.contiguous();
    probs_ = Tensor::empty({rows, v}, DType::f32);
    std::vector<float> losses(static_cast<size_t>(rows));
    ops::crossentropy_forward(losses.data(), probs_.data<float>(), z.data<float>(), tp, rows, v);
    double mean = 0.0;
    for (float l : losses) mean += double(l);
    return float(mean / double(rows));
}

Tensor CrossEntropy::backward() const {
    if (!probs_.defined()) throw Error("fp8kit::nn::CrossEntropy::backward: no forward");
    Tensor d = Tensor::empty(probs_.shape(), DType::f32);
    ops::crossentropy_backward(d.data<float>(), probs_.data<float>(), targets_.data<int32_t>(),
                               1.0f / float(probs_.size(0)), probs_.size(0), probs_.size(1));
    return d;
}

}  // namespace fp8kit::nn
