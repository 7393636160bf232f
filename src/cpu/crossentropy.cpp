// src/cpu/crossentropy.cpp: the cpu backend's softmax cross-entropy: softmax max and sum in
// double, probabilities and losses rounded once; the backward (probs - onehot) * dloss in the
// tensor's precision. Rows split over OpenMP threads, one row per thread in a fixed order.
// Checked against the reference backend by tests/ops/test_crossentropy.cpp.
#include <algorithm>
#include <cmath>

#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void crossentropy_fwd(const detail::CrossEntropyJob& j) {
    T* losses = static_cast<T*>(j.losses);
    T* probs = static_cast<T*>(j.probs);
    const T* logits = static_cast<const T*>(j.logits);
    const int64_t rows = j.rows, v = j.v;
#pragma omp parallel for schedule(static) if (rows * v > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* z = logits + r * v;  // [V]
        double maxv = double(z[0]);
        for (int64_t i = 1; i < v; ++i) maxv = std::max(maxv, double(z[i]));
        double sum = 0.0;
        for (int64_t i = 0; i < v; ++i) sum += std::exp(double(z[i]) - maxv);
        for (int64_t i = 0; i < v; ++i) probs[r * v + i] = T(std::exp(double(z[i]) - maxv) / sum);
        // -log softmax computed from the logits, not from the rounded probability
        losses[r] = T(std::log(sum) - (double(z[j.targets[r]]) - maxv));
    }
}

template <class T>
void crossentropy_bwd(const detail::CrossEntropyJob& j) {
    T* dlogits = static_cast<T*>(j.dlogits);
    const T* probs = static_cast<const T*>(j.saved_probs);
    const T dloss = T(j.dloss);
    const int64_t rows = j.rows, v = j.v;
#pragma omp parallel for schedule(static) if (rows * v > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < v; ++i)
            dlogits[r * v + i] = (probs[r * v + i] - (i == j.targets[r] ? T(1) : T(0))) * dloss;
}

}  // namespace

void crossentropy_forward(const detail::CrossEntropyJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { crossentropy_fwd<T>(j); });
}
void crossentropy_backward(const detail::CrossEntropyJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { crossentropy_bwd<T>(j); });
}

}  // namespace fp8kit::cpu
