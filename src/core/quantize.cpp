// src/core/quantize.cpp: the public cast operations - argument checks, output allocation, and the
// hand-off to the active backend (src/ref/quantize.cpp, src/cpu/quantize.cpp).
// Checked by tests/ops/test_quantize.cpp (backends against ref) and tests/unit/test_quantize.cpp.
#include <cmath>
#include <string>

#include "core/ops.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/quantize.hpp"

namespace fp8kit {

namespace {

using detail::MatrixRef;

bool is_data_format(Format f) { return f != Format::e8m0fnu; }

const detail::BackendOps& ops() { return detail::backend_ops(active_backend()); }

// The rows of the [rows, cols] matrix a tensor is quantized as: the product of every dimension
// but the last (1 for a scalar). Not numel / cols, which loses the rows of a [rows, 0] tensor.
int64_t leading_rows(const Tensor& t) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < t.dim(); ++d) rows *= t.shape()[size_t(d)];
    return rows;
}

// `t` itself when it is a contiguous host tensor of this shape and dtype, else a new one.
Tensor reuse_or_empty(const Tensor& t, const Shape& shape, DType dtype) {
    if (t.defined() && t.dtype() == dtype && t.shape() == shape && t.is_contiguous() && t.device() == Device::cpu) return t;
    return Tensor::empty(shape, dtype);
}

Tensor scale_tensor(const Tensor& reuse, GroupShape shape, bool e8m0) {
    return reuse_or_empty(reuse, {shape.rows, shape.cols}, e8m0 ? DType::e8m0fnu : DType::f32);
}

}  // namespace

detail::Matrix detail::as_matrix(const Tensor& x, const char* fn) {
    const std::string where = std::string("fp8kit::") + fn + ": ";
    if (!x.defined()) throw Error(where + "input tensor is undefined");
    if (x.dtype() != DType::f32 && x.dtype() != DType::bf16 && x.dtype() != DType::f16) {
        throw Error(where + "input dtype is " + std::string(to_string(x.dtype())) + ", expected f32, bf16 or f16");
    }
    if (x.device() != Device::cpu) throw Error(where + "input is on device cuda; this build runs host tensors only");
    const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
    const int64_t rows = leading_rows(x);
    detail::Matrix m;
    if (x.dim() == 2 && x.strides()[1] == 1 && x.strides()[0] >= cols) {
        m.keep = x;
        m.ref = {x.raw_data(), x.dtype(), rows, cols, x.strides()[0]};
    } else {
        m.keep = x.contiguous();
        m.ref = {m.keep.raw_data(), x.dtype(), rows, cols, cols};
    }
    return m;
}

void detail::check_quantize_options(const QuantizeOptions& o, const std::string& where) {
    if (!is_data_format(o.format)) {
        throw Error(where + "format e8m0fnu holds scales, not data; expected e4m3fn, e5m2, e4m3fnuz or e5m2fnuz");
    }
    if (!(o.amax_epsilon >= 0.0f) || std::isinf(o.amax_epsilon)) {
        throw Error(where + "amax_epsilon is " + std::to_string(o.amax_epsilon) + ", expected a finite value >= 0");
    }
    if (o.scale) {
        if (o.scaling.granularity != Granularity::tensor) {
            throw Error(where + "a given scale needs tensor scaling, got " + to_string(o.scaling));
        }
        if (!(*o.scale > 0.0f) || std::isinf(*o.scale)) {
            throw Error(where + "scale is " + std::to_string(*o.scale) + ", expected a finite value > 0");
        }
    }
    (void)o.scaling.group_shape(1, 1);  // checks block dimensions
}

ScaleRule scale_rule(const QuantizeOptions& o) {
    return {o.format, o.scaling.granularity == Granularity::mx32, o.mx_rounding, format_info(o.format).max,
            o.amax_epsilon, o.power_of_two, o.scale.has_value(), o.scale.value_or(1.0f)};
}

int64_t QTensor::rows() const { return leading_rows(data); }

int64_t QTensor::cols() const { return data.dim() == 0 ? 1 : data.shape().back(); }

QTensor QTensor::transposed() const {
    if (!has_transpose()) throw Error("fp8kit::QTensor::transposed: this QTensor has no transposed copy");
    QTensor t;
    t.data = data_t;
    t.format = format;
    t.scaling = scaling;
    t.scale_inv = scale_inv_t;
    t.amax = amax;
    return t;
}

float amax(const Tensor& x) {
    const detail::Matrix m = detail::as_matrix(x, "amax");
    if (m.ref.rows == 0 || m.ref.cols == 0) return 0.0f;
    return ops().amax(m.ref);
}

Tensor amax(const Tensor& x, const Scaling& s) {
    const detail::Matrix m = detail::as_matrix(x, "amax");
    const GroupShape ss = s.scale_shape(m.ref.rows, m.ref.cols);
    Tensor out = Tensor::empty({ss.rows, ss.cols}, DType::f32);
    if (out.numel() > 0) ops().group_amax(m.ref, s.group_shape(m.ref.rows, m.ref.cols), out.data<float>());
    return out;
}

QTensor quantize(const Tensor& x, const QuantizeOptions& o) {
    QTensor q;
    return quantize(x, o, q);
}

QTensor& quantize(const Tensor& x, const QuantizeOptions& o, QTensor& out) {
    const std::string where = o.transpose ? "fp8kit::cast_transpose: " : "fp8kit::quantize: ";
    detail::check_quantize_options(o, where);
    const detail::Matrix m = detail::as_matrix(x, o.transpose ? "cast_transpose" : "quantize");
    const int64_t rows = m.ref.rows, cols = m.ref.cols;
    const bool mx = o.scaling.granularity == Granularity::mx32;

    // Built aside and moved into `out` when complete: after an error `out` still describes what it
    // did before (reused buffers may hold partial codes).
    QTensor q;
    q.format = o.format;
    q.scaling = o.scaling;
    q.data = reuse_or_empty(out.data, x.shape(), dtype_of(o.format));
    q.scale_inv = scale_tensor(out.scale_inv, o.scaling.scale_shape(rows, cols), mx);
    // MX elements are encoded with saturation whatever `overflow` says: the spec defines the
    // conversion so, and the floor rule relies on it (values just under 2^(emax+1) * X clamp).
    const Overflow overflow = mx ? Overflow::saturate : o.overflow;
    detail::QuantizeJob job{m.ref, scale_rule(o), overflow, o.scaling.group_shape(rows, cols),
                            o.scaling.group_shape(cols, rows), q.data.data<uint8_t>(), q.scale_inv.raw_data(),
                            nullptr, nullptr, 0.0f};
    if (o.transpose) {
        q.data_t = reuse_or_empty(out.data_t, {cols, rows}, dtype_of(o.format));
        q.scale_inv_t = scale_tensor(out.scale_inv_t, o.scaling.scale_shape(cols, rows), mx);
        job.data_t = q.data_t.data<uint8_t>();
        job.scale_inv_t = q.scale_inv_t.raw_data();
    }
    if (rows > 0 && cols > 0) ops().quantize(job);
    if (o.non_finite == NonFinite::error && !std::isfinite(job.amax)) {
        throw Error(where + "the input contains " + (std::isnan(job.amax) ? "NaN" : "Inf") +
                    " (amax is " + (std::isnan(job.amax) ? "nan" : "inf") + ") and non_finite is error");
    }
    q.amax = job.amax;
    out = std::move(q);
    return out;
}

QTensor cast_transpose(const Tensor& x, QuantizeOptions opts) {
    opts.transpose = true;
    return quantize(x, opts);
}

Tensor dequantize(const QTensor& q, DType out) {
    const std::string where = "fp8kit::dequantize: ";
    if (out != DType::f32 && out != DType::bf16 && out != DType::f16) {
        throw Error(where + "output dtype " + std::string(to_string(out)) + ", expected f32, bf16 or f16");
    }
    if (!q.data.defined() || q.data.dtype() != dtype_of(q.format)) {
        throw Error(where + "data dtype is " + (q.data.defined() ? std::string(to_string(q.data.dtype())) : "undefined") +
                    ", expected the QTensor's format " + std::string(to_string(q.format)));
    }
    if (q.data.device() != Device::cpu) throw Error(where + "data is on device cuda; this build runs host tensors only");
    const int64_t rows = q.rows(), cols = q.cols();
    const bool mx = q.scaling.granularity == Granularity::mx32;
    const GroupShape ss = q.scaling.scale_shape(rows, cols);
    const DType scale_dtype = mx ? DType::e8m0fnu : DType::f32;
    if (!q.scale_inv.defined() || q.scale_inv.dtype() != scale_dtype || q.scale_inv.shape() != Shape{ss.rows, ss.cols}) {
        throw Error(where + "scale_inv is " +
                    (q.scale_inv.defined() ? std::string(to_string(q.scale_inv.dtype())) + " " + to_string(q.scale_inv.shape())
                                           : std::string("undefined")) +
                    ", expected " + std::string(to_string(scale_dtype)) + " [" + std::to_string(ss.rows) + ", " +
                    std::to_string(ss.cols) + "] for " + to_string(q.scaling) + " scaling of a [" +
                    std::to_string(rows) + ", " + std::to_string(cols) + "] matrix");
    }
    const Tensor data = q.data.contiguous(), scale_inv = q.scale_inv.contiguous();
    Tensor result = Tensor::empty(q.data.shape(), out);
    const detail::DequantizeJob job{data.data<uint8_t>(), q.format, rows, cols, q.scaling.group_shape(rows, cols),
                                    scale_inv.raw_data(), mx, result.raw_data(), out};
    if (rows > 0 && cols > 0) ops().dequantize(job);
    return result;
}

}  // namespace fp8kit
