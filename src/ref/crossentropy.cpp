// src/ref/crossentropy.cpp: the reference softmax cross-entropy - plain loops in float64, each
// output rounded once; the loss from the logits (log-sum-exp), not from a rounded probability.
// The ground truth of tests/ops/test_crossentropy.cpp.
#include <algorithm>
#include <cmath>

#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

template <class T>
void crossentropy_fwd(const detail::CrossEntropyJob& j) {
    const T* logits = static_cast<const T*>(j.logits);
    for (int64_t r = 0; r < j.rows; ++r) {
        const T* z = logits + r * j.v;
        double maxv = double(z[0]);
        for (int64_t i = 1; i < j.v; ++i) maxv = std::max(maxv, double(z[i]));
        double sum = 0.0;
        for (int64_t i = 0; i < j.v; ++i) sum += std::exp(double(z[i]) - maxv);
        for (int64_t i = 0; i < j.v; ++i) static_cast<T*>(j.probs)[r * j.v + i] = T(std::exp(double(z[i]) - maxv) / sum);
        static_cast<T*>(j.losses)[r] = T(std::log(sum) + maxv - double(z[j.targets[r]]));
    }
}

template <class T>
void crossentropy_bwd(const detail::CrossEntropyJob& j) {
    const T* probs = static_cast<const T*>(j.saved_probs);
    for (int64_t r = 0; r < j.rows; ++r)
        for (int64_t i = 0; i < j.v; ++i) {
            const double y = i == j.targets[r] ? 1.0 : 0.0;
            static_cast<T*>(j.dlogits)[r * j.v + i] = T((double(probs[r * j.v + i]) - y) * j.dloss);
        }
}

}  // namespace

void crossentropy_forward(const detail::CrossEntropyJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { crossentropy_fwd<T>(j); });
}
void crossentropy_backward(const detail::CrossEntropyJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { crossentropy_bwd<T>(j); });
}

}  // namespace fp8kit::ref
