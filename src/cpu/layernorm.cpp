// src/cpu/layernorm.cpp: the cpu backend's LayerNorm and RMSNorm forward/backward (as
// torch.nn.LayerNorm / torch.nn.RMSNorm). Row statistics are summed in double, then each output
// is formed in float32; rows are split over OpenMP threads, each row computed by one thread in a
// fixed order, so results do not depend on the thread count. Parameter gradients sum the rows in
// order on one thread. Checked against the reference backend by tests/ops/test_layernorm.cpp.
#include <cmath>

#include "core/ops.hpp"
#include "cpu/layer_parallel.hpp"

namespace fp8kit::cpu {

namespace {

template <class T>
void layernorm_fwd(const detail::NormJob& j) {
    T* out = static_cast<T*>(j.out);
    T* mean = static_cast<T*>(j.mean);
    T* rstd = static_cast<T*>(j.rstd);
    const T* inp = static_cast<const T*>(j.inp);
    const T* weight = static_cast<const T*>(j.weight);
    const T* bias = static_cast<const T*>(j.bias);
    const int64_t rows = j.rows, c = j.c;
#pragma omp parallel for schedule(static) if (rows * c > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* x = inp + r * c;  // [C]
        double s = 0.0;
        for (int64_t i = 0; i < c; ++i) s += double(x[i]);
        const double m = s / double(c);
        double v = 0.0;
        for (int64_t i = 0; i < c; ++i) v += (double(x[i]) - m) * (double(x[i]) - m);
        const double rs = 1.0 / std::sqrt(v / double(c) + j.eps);
        for (int64_t i = 0; i < c; ++i) out[r * c + i] = T((double(x[i]) - m) * rs) * weight[i] + bias[i];
        mean[r] = T(m);
        rstd[r] = T(rs);
    }
}

template <class T>
void layernorm_bwd(const detail::NormBackwardJob& j) {
    T* dinp = static_cast<T*>(j.dinp);
    T* dweight = static_cast<T*>(j.dweight);
    T* dbias = static_cast<T*>(j.dbias);
    const T* dout = static_cast<const T*>(j.dout);
    const T* inp = static_cast<const T*>(j.inp);
    const T* weight = static_cast<const T*>(j.weight);
    const T* mean = static_cast<const T*>(j.mean);
    const T* rstd = static_cast<const T*>(j.rstd);
    const int64_t rows = j.rows, c = j.c;
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
void rmsnorm_fwd(const detail::NormJob& j) {
    T* out = static_cast<T*>(j.out);
    T* rstd = static_cast<T*>(j.rstd);
    const T* inp = static_cast<const T*>(j.inp);
    const T* weight = static_cast<const T*>(j.weight);
    const int64_t rows = j.rows, c = j.c;
#pragma omp parallel for schedule(static) if (rows * c > parallel_min_work)
    for (int64_t r = 0; r < rows; ++r) {
        const T* x = inp + r * c;
        double ss = 0.0;
        for (int64_t i = 0; i < c; ++i) ss += double(x[i]) * double(x[i]);
        const double rs = 1.0 / std::sqrt(ss / double(c) + j.eps);
        for (int64_t i = 0; i < c; ++i) out[r * c + i] = T(double(x[i]) * rs) * weight[i];
        rstd[r] = T(rs);
    }
}

template <class T>
void rmsnorm_bwd(const detail::NormBackwardJob& j) {
    T* dinp = static_cast<T*>(j.dinp);
    T* dweight = static_cast<T*>(j.dweight);
    const T* dout = static_cast<const T*>(j.dout);
    const T* inp = static_cast<const T*>(j.inp);
    const T* weight = static_cast<const T*>(j.weight);
    const T* rstd = static_cast<const T*>(j.rstd);
    const int64_t rows = j.rows, c = j.c;
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

}  // namespace

void layernorm_forward(const detail::NormJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { layernorm_fwd<T>(j); });
}
void layernorm_backward(const detail::NormBackwardJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { layernorm_bwd<T>(j); });
}
void rmsnorm_forward(const detail::NormJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { rmsnorm_fwd<T>(j); });
}
void rmsnorm_backward(const detail::NormBackwardJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { rmsnorm_bwd<T>(j); });
}

}  // namespace fp8kit::cpu
