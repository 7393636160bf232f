// src/core/quantize.cpp: the public cast operations - argument checks, output allocation on the
// inputs' device, and the hand-off to the backend of that device (src/ref/quantize.cpp,
// src/cpu/quantize.cpp); the non-finite policy's error.
// Checked by tests/ops/test_quantize.cpp (backends against ref) and tests/unit/test_quantize.cpp.
#include <cmath>
#include <string>

#include "core/math.hpp"
#include "core/ops.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/quantize.hpp"

namespace fp8kit {

namespace {

using detail::MatrixRef;

bool is_data_format(Format f) { return f != Format::e8m0fnu; }

// The rows of the [rows, cols] matrix a tensor is quantized as: the product of every dimension
// but the last (1 for a scalar). Not numel / cols, which loses the rows of a [rows, 0] tensor.
int64_t leading_rows(const Tensor& t) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < t.dim(); ++d) rows *= t.shape()[size_t(d)];
    return rows;
}

// `t` itself when it is a contiguous, writable tensor of this shape and dtype on `device`, else a new one.
Tensor reuse_or_empty(const Tensor& t, const Shape& shape, DType dtype, Device device) {
    if (t.defined() && t.dtype() == dtype && t.shape() == shape && t.is_contiguous() && t.device() == device &&
        !t.read_only()) {
        return t;
    }
    return Tensor::empty(shape, dtype, device);
}

Tensor scale_tensor(const Tensor& reuse, GroupShape shape, bool e8m0, Device device) {
    return reuse_or_empty(reuse, {shape.rows, shape.cols}, e8m0 ? DType::e8m0fnu : DType::f32, device);
}

std::string index_string(int64_t i, int64_t j, const Tensor& x) {
    if (x.dim() <= 1) return "[" + std::to_string(x.dim() == 0 ? 0 : j) + "]";
    // The matrix row i spans every dimension but the last: name the full index.
    std::string s = "]";
    s.insert(0, std::to_string(j));
    for (int64_t d = x.dim() - 2; d >= 0; --d) {
        const int64_t n = x.shape()[size_t(d)];
        s.insert(0, std::to_string(i % n) + ", ");
        i /= n;
    }
    return "[" + s;
}

}  // namespace

detail::Matrix detail::as_matrix(const Tensor& x, const char* fn) {
    const auto where = [fn] { return std::string("fp8kit::") + fn + ": "; };  // built only on error
    if (!x.defined()) throw Error(where() + "input tensor is undefined");
    if (x.dtype() != DType::f32 && x.dtype() != DType::bf16 && x.dtype() != DType::f16) {
        throw Error(where() + "input dtype is " + std::string(to_string(x.dtype())) + ", expected f32, bf16 or f16");
    }
    const int64_t cols = x.dim() == 0 ? 1 : x.shape().back();
    const int64_t rows = leading_rows(x);
    detail::Matrix m;
    if (x.dim() == 2 && x.strides()[1] == 1 && x.strides()[0] >= cols) {
        m.ref = {x.const_raw_data(), x.dtype(), rows, cols, x.strides()[0]};  // in place: no handle copied
    } else {
        m.keep = x.contiguous();
        m.ref = {m.keep.const_raw_data(), x.dtype(), rows, cols, cols};
    }
    return m;
}

void detail::throw_non_finite(const MatrixRef& x, const Tensor& tensor, const std::string& where) {
    for (int64_t i = 0; i < x.rows; ++i) {
        for (int64_t j = 0; j < x.cols; ++j) {
            const float v = load_float(x.data, x.dtype, i * x.ld + j);
            if (std::isfinite(v)) continue;
            throw Error(where + "tensor " + (tensor.name().empty() ? "" : quote_printable(tensor.name()) + " ") + "holds " +
                        (std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf") + " at index " + index_string(i, j, tensor) +
                        " and non_finite is error");
        }
    }
    throw Error(where + "its amax is not finite, yet no element is NaN or Inf");  // a backend bug
}

void detail::check_quantize_options(const QuantizeOptions& o, std::string_view where) {
    if (!is_data_format(o.format)) {
        throw Error(std::string(where) + "format e8m0fnu holds scales, not data; expected e4m3fn, e5m2, e4m3fnuz or e5m2fnuz");
    }
    if (!(o.amax_epsilon >= 0.0f) || std::isinf(o.amax_epsilon)) {
        throw Error(std::string(where) + "amax_epsilon is " + std::to_string(o.amax_epsilon) + ", expected a finite value >= 0");
    }
    if (o.scale.defined()) {
        if (o.scaling.granularity != Granularity::tensor) {
            throw Error(std::string(where) + "a given scale needs tensor scaling, got " + to_string(o.scaling));
        }
        if (o.scale.dtype() != DType::f32 || o.scale.numel() != 1 || !o.scale.is_contiguous()) {
            throw Error(std::string(where) + "scale is " + std::string(to_string(o.scale.dtype())) + " " + to_string(o.scale.shape()) +
                        ", expected one f32 value");
        }
        // A host scale is checked here; a device backend checks its own before use.
        if (o.scale.device() == Device::cpu) {
            const float v = *o.scale.data<const float>();
            if (!(v > 0.0f) || std::isinf(v)) {
                throw Error(std::string(where) + "scale is " + std::to_string(v) + ", expected a finite value > 0");
            }
        }
    }
    (void)o.scaling.group_shape(1, 1);  // checks block dimensions
}

void detail::refuse_non_finite(const Dispatch& d, const MatrixRef& x, const Tensor& tensor, const std::string& where) {
    if (x.rows == 0 || x.cols == 0) return;
    if (d.device == Device::cpu) {
        float a = 0.0f;
        d.ops.amax(d.ctx, x, &a);
        if (!std::isfinite(a)) throw_non_finite(x, tensor, where);
        return;
    }
    const Tensor a = Tensor::empty({1}, DType::f32, d.device);
    d.ops.amax(d.ctx, x, static_cast<float*>(a.raw_data()));
    if (std::isfinite(a.to(Device::cpu).get({0}))) return;
    const Tensor host = tensor.to(Device::cpu);
    throw_non_finite(as_matrix(host, "quantize").ref, tensor, where);
}

detail::ScaleRule detail::scale_rule(const QuantizeOptions& o) {
    return {o.format, o.scaling.granularity == Granularity::mx32, o.mx_rounding, format_info(o.format).max,
            o.amax_epsilon, o.power_of_two,
            o.scale.defined() ? static_cast<const float*>(o.scale.const_raw_data()) : nullptr};
}

Format QTensor::format() const {
    if (!data.defined() || !is_fp8(data.dtype()) || data.dtype() == DType::e8m0fnu) {
        throw Error("fp8kit::QTensor::format: data is " +
                    (data.defined() ? std::string(to_string(data.dtype())) : std::string("undefined")) +
                    ", expected FP8 codes");
    }
    return format_of(data.dtype());
}

int64_t QTensor::rows() const { return leading_rows(data); }

int64_t QTensor::cols() const { return data.dim() == 0 ? 1 : data.shape().back(); }

QTensor QTensor::to(Device device) const {
    QTensor r = *this;
    for (Tensor* t : {&r.data, &r.scale_inv, &r.amax, &r.data_t, &r.scale_inv_t}) {
        if (t->defined()) *t = t->to(device);
    }
    return r;
}

QTensor QTensor::transposed() const {
    if (!has_transpose()) throw Error("fp8kit::QTensor::transposed: this QTensor has no transposed copy");
    QTensor t;
    t.data = data_t;
    t.scaling = scaling;
    t.scale_inv = scale_inv_t;
    t.amax = amax;
    return t;
}

float amax(const Tensor& x) {
    const detail::Dispatch d = detail::dispatch("amax", {{"x", &x}});
    if (d.device != Device::cpu) return amax(x, Scaling::tensor()).to(Device::cpu).get({0, 0});  // a copy to the host
    const detail::Matrix m = detail::as_matrix(x, "amax");
    float result = 0.0f;
    if (m.ref.rows > 0 && m.ref.cols > 0) d.ops.amax(d.ctx, m.ref, &result);
    return result;
}

Tensor amax(const Tensor& x, const Scaling& s) {
    const detail::Dispatch d = detail::dispatch("amax", {{"x", &x}});
    const detail::Matrix m = detail::as_matrix(x, "amax");
    const GroupShape ss = s.scale_shape(m.ref.rows, m.ref.cols);
    Tensor out = Tensor::empty({ss.rows, ss.cols}, DType::f32, d.device);
    if (out.numel() > 0) d.ops.group_amax(d.ctx, m.ref, s.group_shape(m.ref.rows, m.ref.cols), static_cast<float*>(out.raw_data()));
    return out;
}

QTensor quantize(const Tensor& x, const QuantizeOptions& o) {
    QTensor q;
    return quantize(x, o, q);
}

QTensor& quantize(const Tensor& x, const QuantizeOptions& o, QTensor& out) {
    const std::string where = o.transpose ? "fp8kit::cast_transpose: " : "fp8kit::quantize: ";
    detail::check_quantize_options(o, where);
    const char* fn = o.transpose ? "cast_transpose" : "quantize";
    const detail::Dispatch d = detail::dispatch(fn, {{"x", &x}, {"scale", &o.scale}});
    const detail::Matrix m = detail::as_matrix(x, fn);
    const int64_t rows = m.ref.rows, cols = m.ref.cols;
    // NonFinite::error refuses before anything is written (an amax pass first: the policy of the
    // checkpoint tools, where one more read of a weight costs nothing).
    if (o.non_finite == NonFinite::error) detail::refuse_non_finite(d, m.ref, x, where);
    const bool mx = o.scaling.granularity == Granularity::mx32;

    // Built aside and moved into `out` when complete: `out` describes what it did before until then.
    QTensor q;
    q.scaling = o.scaling;
    q.data = reuse_or_empty(out.data, x.shape(), dtype_of(o.format), d.device);
    q.scale_inv = scale_tensor(out.scale_inv, o.scaling.scale_shape(rows, cols), mx, d.device);
    q.amax = reuse_or_empty(out.amax, {1}, DType::f32, d.device);
    // MX elements are encoded with saturation whatever `overflow` says: the spec defines the
    // conversion so, and the floor rule relies on it (values just under 2^(emax+1) * X clamp).
    const Overflow overflow = mx ? Overflow::saturate : o.overflow;
    auto* amax_out = static_cast<float*>(q.amax.raw_data());
    detail::QuantizeJob job{d.ctx, m.ref, detail::scale_rule(o), overflow, o.scaling.group_shape(rows, cols),
                            o.scaling.group_shape(cols, rows), static_cast<uint8_t*>(q.data.raw_data()),
                            q.scale_inv.raw_data(), nullptr, nullptr, amax_out};
    if (o.transpose) {
        q.data_t = reuse_or_empty(out.data_t, {cols, rows}, dtype_of(o.format), d.device);
        q.scale_inv_t = scale_tensor(out.scale_inv_t, o.scaling.scale_shape(cols, rows), mx, d.device);
        job.data_t = static_cast<uint8_t*>(q.data_t.raw_data());
        job.scale_inv_t = q.scale_inv_t.raw_data();
    }
    if (rows > 0 && cols > 0) {
        d.ops.quantize(job);
    } else if (d.device == Device::cpu) {
        *amax_out = 0.0f;
    } else {
        q.amax = Tensor::zeros({1}, DType::f32, d.device);
    }
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
    if (!q.data.defined() || !is_fp8(q.data.dtype()) || q.data.dtype() == DType::e8m0fnu) {
        throw Error(where + "data dtype is " + (q.data.defined() ? std::string(to_string(q.data.dtype())) : "undefined") +
                    ", expected FP8 codes (e4m3fn, e5m2, e4m3fnuz or e5m2fnuz)");
    }
    const detail::Dispatch d = detail::dispatch("dequantize", {{"data", &q.data}, {"scale_inv", &q.scale_inv}});
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
    Tensor result = Tensor::empty(q.data.shape(), out, d.device);
    const detail::DequantizeJob job{d.ctx, static_cast<const uint8_t*>(data.const_raw_data()), q.format(), rows, cols,
                                    q.scaling.group_shape(rows, cols), scale_inv.const_raw_data(), mx, result.raw_data(), out};
    if (rows > 0 && cols > 0) d.ops.dequantize(job);
    return result;
}

}  // namespace fp8kit
