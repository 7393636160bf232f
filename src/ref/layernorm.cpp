// src/ref/layernorm.cpp: the reference LayerNorm and RMSNorm forward/backward - plain loops,
// everything in float64 from the inputs, each output rounded once. The ground truth of
// tests/ops/test_layernorm.cpp; its backward is checked by finite differences in
// tests/ops/test_backward.cpp.
#include <cmath>
#include <vector>

#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

// Mean and 1 / sqrt(variance + eps) of one row (layernorm), or 1 / sqrt(mean square + eps).
struct RowStats {
    double mean, rstd;
};

template <class T>
RowStats row_stats(const T* x, int64_t c, double eps, bool centered) {
    double s = 0.0;
    for (int64_t i = 0; i < c; ++i) s += double(x[i]);
    const double m = centered ? s / double(c) : 0.0;
    double v = 0.0;
    for (int64_t i = 0; i < c; ++i) v += (double(x[i]) - m) * (double(x[i]) - m);
    return {m, 1.0 / std::sqrt(v / double(c) + eps)};
}

template <class T>
void norm_fwd(const detail::NormJob& j, bool centered) {
    const T* inp = static_cast<const T*>(j.inp);
    const T* w = static_cast<const T*>(j.weight);
    const T* b = static_cast<const T*>(j.bias);
    T* out = static_cast<T*>(j.out);
    for (int64_t r = 0; r < j.rows; ++r) {
        const T* x = inp + r * j.c;
        const RowStats st = row_stats(x, j.c, j.eps, centered);
        for (int64_t i = 0; i < j.c; ++i) {
            const double y = (double(x[i]) - st.mean) * st.rstd * double(w[i]) + (b != nullptr ? double(b[i]) : 0.0);
            out[r * j.c + i] = T(y);
        }
        if (centered) static_cast<T*>(j.mean)[r] = T(st.mean);
        static_cast<T*>(j.rstd)[r] = T(st.rstd);
    }
}

// From the saved (rounded) mean and rstd, as the backward receives them:
//   layernorm: dx = rstd (dn - mean(dn) - norm mean(dn norm)), dn = dout w, norm = (x - mean) rstd
//   rmsnorm:   dx = rstd (dn - norm mean(dn norm)),            norm = x rstd
template <class T>
void norm_bwd(const detail::NormBackwardJob& j, bool centered) {
    const T* dout = static_cast<const T*>(j.dout);
    const T* inp = static_cast<const T*>(j.inp);
    const T* w = static_cast<const T*>(j.weight);
    const T* rstd = static_cast<const T*>(j.rstd);
    std::vector<double> dw(size_t(j.c), 0.0), db(size_t(j.c), 0.0);
    for (int64_t i = 0; i < j.c; ++i) {
        dw[size_t(i)] = double(static_cast<const T*>(j.dweight)[i]);
        if (centered) db[size_t(i)] = double(static_cast<const T*>(j.dbias)[i]);
    }
    for (int64_t r = 0; r < j.rows; ++r) {
        const double m = centered ? double(static_cast<const T*>(j.mean)[r]) : 0.0, rs = double(rstd[r]);
        const T* x = inp + r * j.c;
        const T* g = dout + r * j.c;
        double dm = 0.0, dnm = 0.0;
        for (int64_t i = 0; i < j.c; ++i) {
            const double norm = (double(x[i]) - m) * rs, dn = double(g[i]) * double(w[i]);
            dm += dn;
            dnm += dn * norm;
            dw[size_t(i)] += double(g[i]) * norm;
            db[size_t(i)] += double(g[i]);
        }
        dm = centered ? dm / double(j.c) : 0.0;
        dnm /= double(j.c);
        for (int64_t i = 0; i < j.c; ++i) {
            const double norm = (double(x[i]) - m) * rs;
            static_cast<T*>(j.dinp)[r * j.c + i] = T(rs * (double(g[i]) * double(w[i]) - dm - norm * dnm));
        }
    }
    for (int64_t i = 0; i < j.c; ++i) {
        static_cast<T*>(j.dweight)[i] = T(dw[size_t(i)]);
        if (centered) static_cast<T*>(j.dbias)[i] = T(db[size_t(i)]);
    }
}

}  // namespace

void layernorm_forward(const detail::NormJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { norm_fwd<T>(j, true); });
}
void layernorm_backward(const detail::NormBackwardJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { norm_bwd<T>(j, true); });
}
void rmsnorm_forward(const detail::NormJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { norm_fwd<T>(j, false); });
}
void rmsnorm_backward(const detail::NormBackwardJob& j) {
    detail::with_float_type(j.dtype, [&]<class T>(T) { norm_bwd<T>(j, false); });
}

}  // namespace fp8kit::ref
