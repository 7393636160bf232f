// src/core/gemm.cpp: the public GEMM entry points - argument checks with errors that name the
// argument, the K group rule, PackedWeight, output allocation (or the caller's output) - then the
// gemm of the inputs' device's backend.
// Checked by tests/unit/test_gemm.cpp (errors, K groups) and tests/ops/test_gemm.cpp (results).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/host_memory.hpp"
#include "core/math.hpp"
#include "core/ops.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/gemm.hpp"

namespace fp8kit {

namespace {

using detail::GemmOperand;

std::string shape_str(const Shape& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

bool five_bit_exponent(Format f) { return f == Format::e5m2 || f == Format::e5m2fnuz; }

// How far one scale reaches along K (the operand's columns).
int64_t k_extent(const Scaling& s, int64_t k, const char* which) {
    switch (s.granularity) {
        case Granularity::tensor:
        case Granularity::row: return k;
        case Granularity::column:
            throw Error(std::string("fp8kit::gemm: ") + which + " has column scaling, one scale per element of K; " +
                        "a GEMM needs scales that factor out of the K sum (tensor, row, block or mx32)");
        case Granularity::block: return std::min(s.block_cols, k);
        case Granularity::mx32: return std::min<int64_t>(32, k);
    }
    return k;
}

std::string operand_where(const char* which) { return std::string("fp8kit::gemm: ") + which + " "; }

// The GemmOperand of B's or A's codes [rows, k] at data, rows ld apart (null: a PackedWeight's
// released codes, read from its packed layout), with q's scaling and scale_inv, checked.
GemmOperand scaled_operand(const QTensor& q, const uint8_t* data, int64_t rows, int64_t k, int64_t ld, Format format,
                           const char* which) {
    (void)k_extent(q.scaling, k, which);
    const bool mx = q.scaling.granularity == Granularity::mx32;
    const GroupShape scales = q.scaling.scale_shape(rows, k);
    const DType want_dtype = mx ? DType::e8m0fnu : DType::f32;
    const Tensor& si = q.scale_inv;
    if (!si.defined() || si.dim() != 2 || si.size(0) != scales.rows || si.size(1) != scales.cols ||
        si.dtype() != want_dtype || !si.is_contiguous()) {
        throw Error(operand_where(which) + "scale_inv must be a contiguous " + std::string(to_string(want_dtype)) +
                    " tensor of shape " + shape_str(Shape{scales.rows, scales.cols}) + " for " + to_string(q.scaling) +
                    " scaling of " + shape_str(Shape{rows, k}) + ", got " +
                    (si.defined() ? std::string(to_string(si.dtype())) + " " + shape_str(si.shape()) : std::string("none")));
    }
    return {data, rows, k, ld, format, q.scaling.group_shape(rows, k), si.const_raw_data(), mx, scales.cols};
}

// Checks an FP8 QTensor as a GEMM operand [rows, K] ("A" or "B") and describes it.
GemmOperand operand(const QTensor& q, const char* which) {
    // The messages are built only on error: a decode step calls this twice per GEMM.
    const Tensor& d = q.data;
    if (!d.defined()) throw Error(operand_where(which) + "data is undefined");
    if (d.dim() != 2) throw Error(operand_where(which) + "must be 2-d, got shape " + shape_str(d.shape()));
    if (!is_fp8(d.dtype()) || d.dtype() == DType::e8m0fnu) {
        throw Error(operand_where(which) + "data dtype is " + std::string(to_string(d.dtype())) +
                    ", expected an FP8 data format");
    }
    if (d.strides()[1] != 1 || d.strides()[0] < d.shape()[1]) {
        throw Error(operand_where(which) + "data needs unit column stride and rows at least K apart");
    }
    return scaled_operand(q, static_cast<const uint8_t*>(d.const_raw_data()), d.shape()[0], d.shape()[1],
                          d.strides()[0], q.format(), which);
}

void check_pair(Format a, Format b) {
    if (five_bit_exponent(a) && five_bit_exponent(b)) {
        throw Error("fp8kit::gemm: A is " + std::string(to_string(a)) + " and B is " + std::string(to_string(b)) +
                    "; two 5-bit-exponent operands are refused (as cuBLASLt does): use e4m3 for one of them");
    }
}

// An f32/bf16/f16 tensor of an exact shape.
void check_float_tensor(const Tensor& t, std::initializer_list<int64_t> want, const char* what) {
    const auto where = [what] { return std::string("fp8kit::gemm: ") + what + " "; };  // built only on error
    if (!t.defined()) throw Error(where() + "is undefined");
    if (t.dtype() != DType::f32 && t.dtype() != DType::bf16 && t.dtype() != DType::f16) {
        throw Error(where() + "dtype is " + std::string(to_string(t.dtype())) + ", expected f32, bf16 or f16");
    }
    if (!std::equal(t.shape().begin(), t.shape().end(), want.begin(), want.end())) {
        throw Error(where() + "has shape " + shape_str(t.shape()) + ", expected " + shape_str(Shape(want)));
    }
}

}  // namespace

int64_t gemm_k_group(const Scaling& a, const Scaling& b, int64_t k) {
    const int64_t ka = k_extent(a, k, "A"), kb = k_extent(b, k, "B");
    const int64_t lo = std::min(ka, kb), hi = std::max(ka, kb);
    if (lo <= 0) return std::max<int64_t>(k, 1);
    if (hi % lo != 0 && hi != k) {
        throw Error("fp8kit::gemm: A's scaling " + to_string(a) + " and B's " + to_string(b) +
                    " do not nest along K (" + std::to_string(ka) + " and " + std::to_string(kb) +
                    " wide): one must divide the other");
    }
    return lo;
}

struct detail::PackedAccess {
    static const void* packed(const PackedWeight& w) noexcept { return w.packed_.get(); }
    static PackedWeight for_one_call(const QTensor& b) { return PackedWeight(b, PackedWeight::ForOneCall{}); }
};

// Packed for the widest K group B allows; a GEMM whose A needs narrower groups repacks.
PackedWeight::PackedWeight(const QTensor& b) : PackedWeight(b, b.scaling) {}

PackedWeight::PackedWeight(const QTensor& b, const Scaling& a_scaling) : PackedWeight(b, ForOneCall{}) {
    k_group_ = gemm_k_group(a_scaling, b.scaling, k_);
    // K = 0: nothing to pack, and no scale to read (scale_inv has no columns).
    if (k_ > 0) {
        const detail::Dispatch d = detail::dispatch("PackedWeight", {{"data", &b.data}, {"scale_inv", &b.scale_inv}});
        packed_ = d.ops.pack_weight(d.ctx, operand(b, "B"), k_group_, true, &packed_bytes_);
    }
}

// b checked and described, nothing packed: K group 0 matches no GEMM's, so run_gemm packs B for
// its call, for the K group its A needs.
PackedWeight::PackedWeight(const QTensor& b, ForOneCall) : source_(b) {
    const detail::Dispatch d = detail::dispatch("PackedWeight", {{"data", &b.data}, {"scale_inv", &b.scale_inv}});
    backend_ = d.backend;
    const GemmOperand op = operand(b, "B");
    n_ = op.rows;
    k_ = op.k;
    format_ = op.format;
}

size_t PackedWeight::packed_bytes() const noexcept { return packed_bytes_; }

void PackedWeight::release_codes() {
    if (released_) return;
    // Which backends' layouts hold the codes: those whose unpack_weight reads them back (an empty
    // weight has none to hold).
    if (packed_ == nullptr && n_ * k_ != 0) {
        throw Error("fp8kit::PackedWeight::release_codes: the " + std::string(to_string(backend_)) +
                    " backend reads B as it is, so its codes are the only copy already and stay");
    }
    source_.data = Tensor();
    released_ = true;
}

void PackedWeight::codes_into(const Tensor& out) const {
    const std::string where = "fp8kit::PackedWeight::codes_into: out ";
    if (!out.defined() || out.shape() != Shape{n_, k_} || out.dtype() != dtype_of(format_) || !out.is_contiguous() ||
        out.device() != Device::cpu) {
        throw Error(where + "must be a contiguous host " + std::string(to_string(dtype_of(format_))) + " tensor of shape " +
                    shape_str(Shape{n_, k_}) + ", got " +
                    (out.defined() ? std::string(to_string(out.dtype())) + " " + shape_str(out.shape()) + " on " +
                                         std::string(to_string(out.device()))
                                   : std::string("none")));
    }
    if (n_ * k_ == 0) return;
    auto* dst = static_cast<uint8_t*>(out.raw_data());
    if (!released_) {
        if (source_.data.device() != Device::cpu) throw Error(where + "is on the host but the codes are on " +
                                                              std::string(to_string(source_.data.device())));
        const Tensor& src = source_.data;
        const auto* from = static_cast<const uint8_t*>(src.const_raw_data());
        for (int64_t i = 0; i < n_; ++i) std::copy_n(from + i * src.strides()[0], k_, dst + i * k_);
        return;
    }
    detail::backend_ops(backend_).unpack_weight(packed_.get(), dst, k_);
}

namespace {

// A high-precision A (fused cast or weight-only) as the matrix the backends read.
detail::Matrix hp_matrix(const Tensor& hp) {
    if (hp.dim() != 2) throw Error("fp8kit::gemm: A must be 2-d, got shape " + shape_str(hp.shape()));
    return detail::as_matrix(hp, "gemm");
}

// The GEMM into *given (checked against the shape), else into a new tensor put in *made: the
// caller's handle is not copied.
void run_gemm(const GemmA& a, const PackedWeight& b, const GemmOptions& opts, const Tensor* given, Tensor* made) {
    if (is_fp8(opts.out_dtype) || (opts.out_dtype != DType::f32 && opts.out_dtype != DType::bf16 &&
                                   opts.out_dtype != DType::f16)) {
        throw Error("fp8kit::gemm: out_dtype is " + std::string(to_string(opts.out_dtype)) +
                    ", expected f32, bf16 or f16 (FP8 output: gemm_quantized)");
    }
    const QTensor& qb = b.source();
    const Tensor* a_tensor = a.fp8 ? &a.fp8->data : a.hp ? &*a.hp : nullptr;
    const bool weight_only = !a.fp8 && a.weight_only;
    const detail::Dispatch d = detail::dispatch(
        "gemm", {{"A", a_tensor},
                 {"A's scale_inv", a.fp8 ? &a.fp8->scale_inv : nullptr},
                 {"A's scale", a.fp8 || weight_only ? nullptr : &a.quantize.scale},
                 {"B", &qb.data},
                 {"B's scale_inv", &qb.scale_inv},
                 {"C", opts.c ? &*opts.c : nullptr},
                 {"bias", opts.bias ? &*opts.bias : nullptr},
                 {"out", given}});
    const GemmOperand ob = b.codes_released() ? scaled_operand(qb, nullptr, b.n(), b.k(), b.k(), b.format(), "B")
                                              : operand(qb, "B");

    // A: FP8, or high precision with its options (fused cast).
    GemmOperand oa{};
    detail::Matrix x;
    // Fused: the scales and amax the backend computes for A, dropped after the GEMM - on the host
    // from the thread's scratch list (a decode step's GEMM allocates nothing for them), else one
    // device tensor.
    Tensor a_scales;
    std::optional<detail::Scratch<float>> host_scales;
    detail::QuantizeJob fuse{};
    Scaling a_scaling;
    static const float unit_scale = 1.0f;  // a weight-only A's
    if (a.fp8) {
        oa = operand(*a.fp8, "A");
        a_scaling = a.fp8->scaling;
    } else if (!a.hp || !a.hp->defined()) {
        throw Error("fp8kit::gemm: A is undefined");
    } else if (weight_only) {
        if (d.device != Device::cpu) {
            throw Error("fp8kit::gemm: weight-only A (a tensor without quantize options) runs on the cpu only; A is on " +
                        std::string(to_string(d.device)) + " (give it quantize options: the fused cast)");
        }
        x = hp_matrix(*a.hp);
        // One scale (1) for all of A: one group of its whole extent (at least 1 x 1 when empty).
        const GroupShape whole{std::max<int64_t>(x.ref.rows, 1), std::max<int64_t>(x.ref.cols, 1)};
        oa = {nullptr, x.ref.rows, x.ref.cols, x.ref.cols, ob.format, whole, &unit_scale, false, 1};
    } else {
        const QuantizeOptions& o = a.quantize;
        detail::check_quantize_options(o, "fp8kit::gemm: A's quantize options: ");
        if (o.transpose) throw Error("fp8kit::gemm: A's quantize options ask for a transpose; the GEMM uses A as is");
        x = hp_matrix(*a.hp);
        const int64_t rows = x.ref.rows, cols = x.ref.cols;
        (void)k_extent(o.scaling, cols, "A");
        const bool mx = o.scaling.granularity == Granularity::mx32;
        const GroupShape scales = o.scaling.scale_shape(rows, cols);
        void* scale_inv = nullptr;
        // One buffer (a decode step's GEMM is mostly call cost): the scales (e8m0: a byte of each
        // float), then the amax.
        const int64_t count = scales.rows * scales.cols;
        if (d.device == Device::cpu) {
            host_scales.emplace(count + 1);
            scale_inv = host_scales->get();
        } else {
            a_scales = Tensor::empty({count + 1}, DType::f32, d.device);
            scale_inv = a_scales.raw_data();
        }
        float* const amax = static_cast<float*>(scale_inv) + count;
        fuse = {d.ctx, x.ref, detail::scale_rule(o), mx ? Overflow::saturate : o.overflow,
                o.scaling.group_shape(rows, cols), o.scaling.group_shape(cols, rows), nullptr, scale_inv,
                nullptr, nullptr, amax};
        oa = {nullptr, rows, cols, cols, o.format, fuse.group, fuse.scale_inv, mx, scales.cols};
        a_scaling = o.scaling;
    }
    if (oa.k != ob.k) {
        throw Error("fp8kit::gemm: K mismatch: A is [" + std::to_string(oa.rows) + ", " + std::to_string(oa.k) +
                    "] and B is [" + std::to_string(ob.rows) + ", " + std::to_string(ob.k) + "]");
    }
    if (!weight_only) check_pair(oa.format, ob.format);
    const int64_t m = oa.rows, n = ob.rows, k = oa.k;
    const int64_t kgroup = gemm_k_group(a_scaling, qb.scaling, k);

    // C, the bias, out and B's packing are filled in below.
    detail::GemmJob job{.ctx = d.ctx,
                        .m = m,
                        .n = n,
                        .k = k,
                        .kgroup = kgroup,
                        .a = oa,
                        .b = ob,
                        .fuse = a.fp8 || weight_only ? nullptr : &fuse,
                        .b_packed = nullptr,
                        .alpha = opts.alpha,
                        .beta = opts.beta,
                        .c = detail::MatrixRef{nullptr, DType::f32, 0, 0, 0},
                        .bias = nullptr,
                        .bias_dtype = DType::f32,
                        .activation = opts.activation,
                        .out = nullptr,
                        .out_dtype = opts.out_dtype,
                        .a_hp = weight_only ? x.ref : detail::MatrixRef{}};
    if (!std::isfinite(opts.alpha) || !std::isfinite(opts.beta)) {
        throw Error("fp8kit::gemm: alpha and beta must be finite, got " + std::to_string(opts.alpha) + " and " +
                    std::to_string(opts.beta));
    }
    if (given != nullptr) {
        check_float_tensor(*given, {m, n}, "out");
        if (given->dtype() != opts.out_dtype) {
            throw Error("fp8kit::gemm: out is " + std::string(to_string(given->dtype())) + " but out_dtype is " +
                        std::string(to_string(opts.out_dtype)));
        }
        if (!given->is_contiguous()) throw Error("fp8kit::gemm: out must be contiguous");
        if (given->read_only()) throw Error("fp8kit::gemm: out views read-only memory");
        for (const Tensor* in : {a_tensor, &qb.data}) {
            if (in != nullptr && given->shares_storage_with(*in)) throw Error("fp8kit::gemm: out shares memory with A or B");
        }
    } else {
        *made = Tensor::empty({m, n}, opts.out_dtype, d.device);
    }
    const Tensor& out = given != nullptr ? *given : *made;
    detail::Matrix c;
    if (opts.c) {
        check_float_tensor(*opts.c, {m, n}, "C");
        c = detail::as_matrix(*opts.c, "gemm");
        job.c = c.ref;
    } else if (opts.beta != 0.0f) {
        if (given == nullptr) throw Error("fp8kit::gemm: beta is " + std::to_string(opts.beta) + " but no C was given");
        job.c = {out.const_raw_data(), out.dtype(), m, n, n};  // accumulate: out = alpha AB + beta out
    }
    Tensor bias_copy;  // only for a strided bias
    if (opts.bias) {
        check_float_tensor(*opts.bias, {n}, "bias");
        if (!opts.bias->is_contiguous()) bias_copy = opts.bias->contiguous();
        job.bias = (bias_copy.defined() ? bias_copy : *opts.bias).const_raw_data();
        job.bias_dtype = opts.bias->dtype();
    }
    job.out = out.raw_data();
    if (k == 0 && d.device == Device::cpu) {  // an empty sum: D = beta * C + bias (then the activation); no scale to read
        std::vector<float> row(static_cast<size_t>(n));
        for (int64_t i = 0; i < m; ++i) {
            std::fill(row.begin(), row.end(), 0.0f);
            detail::gemm_epilogue(job, i, 0, row.data(), n);
            detail::gemm_store(job, i, 0, row.data(), n);
        }
        return;
    }

    // A PackedWeight made for another backend, or for wider K groups than A allows, is repacked;
    // a QTensor B (k_group 0) is packed here, for this call (pack_weight, not lasting).
    std::shared_ptr<const void> packed;
    size_t bytes = 0;
    if (b.backend() == d.backend && b.k_group() == kgroup) {
        job.b_packed = detail::PackedAccess::packed(b);
    } else if (b.codes_released()) {
        throw Error("fp8kit::gemm: B's codes were released (PackedWeight::release_codes) when it was packed for the " +
                    std::string(to_string(b.backend())) + " backend and K groups of " +
                    std::to_string(b.k_group()) + "; this GEMM runs on the " +
                    std::string(to_string(d.backend)) + " backend with K groups of " + std::to_string(kgroup) +
                    ", which would need them repacked");
    } else {
        packed = d.ops.pack_weight(d.ctx, ob, kgroup, false, &bytes);
        job.b_packed = packed.get();
    }

    if (m > 0 && n > 0) {
        // NonFinite::error must leave a caller's out untouched: A is checked before the GEMM.
        if (job.fuse != nullptr && a.quantize.non_finite == NonFinite::error) {
            detail::refuse_non_finite(d, x.ref, *a.hp, "fp8kit::gemm: A: ");
        }
        d.ops.gemm(job);
    }
}

}  // namespace

Tensor gemm(const GemmA& a, const PackedWeight& b, const GemmOptions& opts) {
    Tensor out;
    run_gemm(a, b, opts, nullptr, &out);
    return out;
}

void gemm(const GemmA& a, const PackedWeight& b, const GemmOptions& opts, const Tensor& out) {
    if (!out.defined()) throw Error("fp8kit::gemm: out is undefined");
    run_gemm(a, b, opts, &out, nullptr);
}

QTensor gemm_quantized(const GemmA& a, const PackedWeight& b, const GemmOptions& opts, const QuantizeOptions& out) {
    GemmOptions f32 = opts;
    f32.out_dtype = DType::f32;
    return quantize(gemm(a, b, f32), out);
}

Tensor gemm(const GemmA& a, const QTensor& b, const GemmOptions& opts) {
    return gemm(a, detail::PackedAccess::for_one_call(b), opts);
}

void gemm(const GemmA& a, const QTensor& b, const GemmOptions& opts, const Tensor& out) {
    gemm(a, detail::PackedAccess::for_one_call(b), opts, out);
}

QTensor gemm_quantized(const GemmA& a, const QTensor& b, const GemmOptions& opts, const QuantizeOptions& out) {
    return gemm_quantized(a, detail::PackedAccess::for_one_call(b), opts, out);
}

}  // namespace fp8kit
