// tests/ops/layer_bound.hpp: what the layer-op tests (tests/ops/test_{matmul, layernorm, gelu,
// attention, crossentropy, embedding, adamw, residual}.cpp) share - inputs, running an op on a
// backend (the cuda one on device copies), and
// the comparison of a backend's output with the reference's against a per-element error bound
// derived in docs/NUMERICS.md ("Layer ops"), reporting the worst ratio error / bound so that a
// test can also show that a planted error exceeds the bound.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fp8kit/fp8kit.hpp"
#include "fp8kit/ops.hpp"
#include "support.hpp"

namespace fp8kit::test {

inline constexpr double u32 = 0x1p-24;  // unit roundoff of float32
inline constexpr double u64 = 0x1p-53;  // of float64

// gamma_n = n u / (1 - n u): the bound on the relative error of n float32 roundings in a row.
inline double gamma(int64_t n, double u = u32) { return double(n) * u / (1.0 - double(n) * u); }

// The device of backend b's tensors.
inline Device device_of(Backend b) { return b == Backend::cuda ? Device::cuda : Device::cpu; }
// An input as backend b takes it: itself for a host backend (any layout, as the op receives it), a
// device copy for cuda.
inline Tensor moved(const Tensor& t, Backend b) { return b == Backend::cuda && t.defined() ? t.to(Device::cuda) : t; }
// An op's result on the host (itself when it is there).
inline Tensor host(const Tensor& t) { return t.defined() ? t.to(Device::cpu) : t; }

// N(0, scale^2) values, f32, f64, bf16 or f16 (the 16-bit ones through float32).
inline Tensor randn(const Shape& shape, uint32_t seed, double scale = 1.0, DType dtype = DType::f32) {
    Tensor t = Tensor::empty(shape, dtype);
    std::mt19937 rng(seed);
    std::normal_distribution<double> d(0.0, scale);
    for (int64_t i = 0; i < t.numel(); ++i) {
        if (dtype == DType::f64) t.data<double>()[i] = d(rng);
        else if (dtype == DType::bf16) t.data<bf16>()[i] = bf16(float(d(rng)));
        else if (dtype == DType::f16) t.data<f16>()[i] = f16(float(d(rng)));
        else t.data<float>()[i] = float(d(rng));
    }
    return t;
}

// Every element as a double (f32, f64, bf16, f16).
inline std::vector<double> values(const Tensor& t) {
    std::vector<double> v(size_t(t.numel()));
    const Tensor c = t.contiguous();
    for (int64_t i = 0; i < t.numel(); ++i) {
        switch (t.dtype()) {
            case DType::f64: v[size_t(i)] = c.data<const double>()[i]; break;
            case DType::bf16: v[size_t(i)] = double(float(c.data<const bf16>()[i])); break;
            case DType::f16: v[size_t(i)] = double(float(c.data<const f16>()[i])); break;
            default: v[size_t(i)] = double(c.data<const float>()[i]);
        }
    }
    return v;
}

// The largest |got - ref| / bound over the elements (bound 0: any difference is infinite), and
// where; NaN in either counts as infinite unless both are NaN.
struct Worst {
    double ratio = 0;
    int64_t at = -1;
};
inline Worst worst_ratio(const Tensor& got, const Tensor& ref, const std::vector<double>& bound) {
    const std::vector<double> g = values(got), r = values(ref);
    Worst w;
    for (size_t i = 0; i < g.size(); ++i) {
        const double err = std::abs(g[i] - r[i]);
        double ratio = err == 0 || (std::isnan(g[i]) && std::isnan(r[i])) ? 0.0 : bound[i] > 0 ? err / bound[i] : INFINITY;
        if (std::isnan(err) && !(std::isnan(g[i]) && std::isnan(r[i]))) ratio = INFINITY;
        if (ratio > w.ratio) w = {ratio, int64_t(i)};
    }
    return w;
}

// Expects every element of got within its bound of ref.
inline void expect_within(const char* what, const Tensor& got, const Tensor& ref, const std::vector<double>& bound) {
    const Worst w = worst_ratio(got, ref, bound);
    EXPECT_LE(w.ratio, 1.0) << what << ": element " << w.at << " is " << values(got)[size_t(w.at)] << ", ref "
                            << values(ref)[size_t(w.at)] << ", bound " << bound[size_t(w.at)];
}

// Expects a planted error (a wrong answer) to exceed the bound somewhere: the bound is tight
// enough to catch it.
inline void expect_caught(const char* what, const Tensor& wrong, const Tensor& ref, const std::vector<double>& bound) {
    EXPECT_GT(worst_ratio(wrong, ref, bound).ratio, 1.0) << what << ": the planted error stays within the bound";
}

// body(threads) for 1 thread and for the machine's threads (at least 2): the cpu backend's
// results must not depend on the count.
template <class Body>
void for_thread_counts(Body&& body) {
    const int saved = num_threads();
    for (int t : {1, std::max(2, saved)}) {
        SCOPED_TRACE("threads=" + std::to_string(t));
        set_num_threads(t);
        body(t);
    }
    set_num_threads(saved);
}

// Bit-for-bit equality of two tensors (NaN equals NaN).
inline void expect_same(const char* what, const Tensor& a, const Tensor& b) {
    const std::vector<double> x = values(a), y = values(b);
    ASSERT_EQ(x.size(), y.size()) << what;
    for (size_t i = 0; i < x.size(); ++i) {
        if (!(x[i] == y[i] && std::signbit(x[i]) == std::signbit(y[i])) && !(std::isnan(x[i]) && std::isnan(y[i]))) {
            ADD_FAILURE() << what << ": element " << i << " differs: " << x[i] << " vs " << y[i];
            return;
        }
    }
}

}  // namespace fp8kit::test
