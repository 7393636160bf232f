// src/cpu/adamw.cpp: the cpu backend's AdamW update (torch.optim.AdamW), elementwise in the
// tensor's precision in the order of <fp8kit/ops.hpp>'s formula, split over OpenMP threads.
// Checked against the reference backend by tests/ops/test_adamw.cpp.
#include <cmath>

#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void adamw(const detail::AdamWJob& j) {
    T* w = static_cast<T*>(j.param);
    T* m = static_cast<T*>(j.m);
    T* v = static_cast<T*>(j.v);
    const T* g = static_cast<const T*>(j.grad);
    const T lr = T(j.lr), b1 = T(j.beta1), b2 = T(j.beta2), eps = T(j.eps), wd = T(j.weight_decay);
    const T c1 = T(j.c1), c2 = T(j.c2);
#pragma omp parallel for schedule(static) if (j.n > parallel_min_work)
    for (int64_t i = 0; i < j.n; ++i) {
        m[i] = b1 * m[i] + (T(1) - b1) * g[i];
        v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
        w[i] -= lr * wd * w[i];
        w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
}

}  // namespace

void adamw_update(const detail::AdamWJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { adamw<T>(j); });
}

}  // namespace fp8kit::cpu
