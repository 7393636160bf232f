// src/ref/adamw.cpp: the reference AdamW update - the formula of <fp8kit/ops.hpp> in float64 from
// the float inputs and hyperparameters (the new moments used unrounded), each of p, m, v rounded
// once. The ground truth of tests/ops/test_adamw.cpp.
#include <cmath>

#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

template <class T>
void adamw(const detail::AdamWJob& j) {
    const double lr = j.lr, b1 = j.beta1, b2 = j.beta2, eps = j.eps, wd = j.weight_decay, c1 = j.c1, c2 = j.c2;
    for (int64_t i = 0; i < j.n; ++i) {
        T& p = static_cast<T*>(j.param)[i];
        T& m = static_cast<T*>(j.m)[i];
        T& v = static_cast<T*>(j.v)[i];
        const double g = double(static_cast<const T*>(j.grad)[i]);
        const double m1 = b1 * double(m) + (1.0 - b1) * g;
        const double v1 = b2 * double(v) + (1.0 - b2) * g * g;
        const double p1 = double(p) - lr * wd * double(p);
        p = T(p1 - lr * (m1 / c1) / (std::sqrt(v1 / c2) + eps));
        m = T(m1);
        v = T(v1);
    }
}

}  // namespace

void adamw_update(const detail::AdamWJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { adamw<T>(j); });
}

}  // namespace fp8kit::ref
