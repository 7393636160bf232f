// src/ref/quantize.cpp: the reference cast operations - amax, quantize, dequantize and the
// transposed copy - as plain loops over scaling groups, one element at a time, no threads, no
// SIMD. This is the ground truth the fast backends are compared with bit for bit
// (tests/ops/test_quantize.cpp); it is itself checked against hand-computed cases and float64
// arithmetic in tests/unit/test_quantize.cpp.
#include <algorithm>
#include <cmath>

#include "core/math.hpp"
#include "core/ops.hpp"

namespace fp8kit::ref {

namespace {

using detail::GroupScale;
using detail::MatrixRef;
using detail::ScaleRule;

float element(const MatrixRef& x, int64_t i, int64_t j) {
    const int64_t k = i * x.ld + j;
    switch (x.dtype) {
        case DType::bf16: return float(static_cast<const bf16*>(x.data)[k]);
        case DType::f16: return float(static_cast<const f16*>(x.data)[k]);
        default: return static_cast<const float*>(x.data)[k];
    }
}

// max(acc, |v|), where any NaN wins and is reported as the one canonical NaN.
float max_abs(float acc, float v) {
    if (std::isnan(acc) || std::isnan(v)) return detail::f32_from_bits(detail::canonical_nan_bits);
    return std::max(acc, std::fabs(v));
}

// Max |get(i, j)| over rows [i0, i1) and columns [j0, j1).
template <class Get>
float block_amax(const Get& get, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    float a = 0.0f;
    for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) a = max_abs(a, get(i, j));
    }
    return a;
}

// Quantizes the [rows, cols] matrix get(i, j) group by group: amax of the group, its scale by
// the rule, then every element encode(float32(x * scale)). Returns the amax of the whole matrix.
template <class Get>
float quantize_matrix(const Get& get, int64_t rows, int64_t cols, GroupShape g, const ScaleRule& rule,
                      Overflow overflow, uint8_t* data, void* scale_inv) {
    const int64_t gcols = (cols + g.cols - 1) / g.cols;
    float total = 0.0f;
    for (int64_t i0 = 0; i0 < rows; i0 += g.rows) {
        for (int64_t j0 = 0; j0 < cols; j0 += g.cols) {
            const int64_t i1 = std::min(rows, i0 + g.rows), j1 = std::min(cols, j0 + g.cols);
            const float a = block_amax(get, i0, i1, j0, j1);
            total = max_abs(total, a);
            const GroupScale s = group_scale(a, rule);
            const int64_t k = i0 / g.rows * gcols + j0 / g.cols;
            if (rule.mx) {
                static_cast<uint8_t*>(scale_inv)[k] = s.e8m0;
            } else {
                static_cast<float*>(scale_inv)[k] = s.scale_inv;
            }
            for (int64_t i = i0; i < i1; ++i) {
                for (int64_t j = j0; j < j1; ++j) {
                    // The non-finite policy: overflow clamps finite values only; an Inf input
                    // keeps the format's Inf (or NaN) code.
                    const float x = get(i, j);
                    data[i * cols + j] = encode(x * s.scale, rule.format, std::isinf(x) ? Overflow::nonsaturating : overflow);
                }
            }
        }
    }
    return total;
}

}  // namespace

void amax(const ExecContext&, const MatrixRef& x, float* out) {
    *out = block_amax([&](int64_t i, int64_t j) { return element(x, i, j); }, 0, x.rows, 0, x.cols);
}

void group_amax(const ExecContext&, const MatrixRef& x, GroupShape g, float* out) {
    const int64_t gcols = (x.cols + g.cols - 1) / g.cols;
    const auto get = [&](int64_t i, int64_t j) { return element(x, i, j); };
    for (int64_t i0 = 0; i0 < x.rows; i0 += g.rows) {
        for (int64_t j0 = 0; j0 < x.cols; j0 += g.cols) {
            out[i0 / g.rows * gcols + j0 / g.cols] =
                block_amax(get, i0, std::min(x.rows, i0 + g.rows), j0, std::min(x.cols, j0 + g.cols));
        }
    }
}

void quantize(detail::QuantizeJob& job) {
    const MatrixRef& x = job.x;
    const auto get = [&](int64_t i, int64_t j) { return element(x, i, j); };
    *job.amax = quantize_matrix(get, x.rows, x.cols, job.group, job.rule, job.overflow, job.data, job.scale_inv);
    if (job.data_t != nullptr) {
        // The transposed copy is, by definition, the same quantization applied to x^T.
        const auto get_t = [&](int64_t i, int64_t j) { return element(x, j, i); };
        quantize_matrix(get_t, x.cols, x.rows, job.group_t, job.rule, job.overflow, job.data_t, job.scale_inv_t);
    }
}

void dequantize(const detail::DequantizeJob& job) {
    const int64_t gcols = (job.cols + job.group.cols - 1) / job.group.cols;
    for (int64_t i = 0; i < job.rows; ++i) {
        for (int64_t j = 0; j < job.cols; ++j) {
            const int64_t k = i / job.group.rows * gcols + j / job.group.cols;
            const float s = job.e8m0 ? decode(static_cast<const uint8_t*>(job.scale_inv)[k], Format::e8m0fnu)
                                     : static_cast<const float*>(job.scale_inv)[k];
            const float v = decode(job.data[i * job.cols + j], job.format) * s;
            const int64_t o = i * job.cols + j;
            switch (job.out_dtype) {
                case DType::bf16: static_cast<bf16*>(job.out)[o] = bf16(v); break;
                case DType::f16: static_cast<f16*>(job.out)[o] = f16(v); break;
                default: static_cast<float*>(job.out)[o] = v; break;
            }
        }
    }
}

}  // namespace fp8kit::ref
