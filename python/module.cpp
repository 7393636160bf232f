// python/module.cpp: the nanobind extension fp8kit._fp8kit - the formats, bulk encode/decode,
// quantize / cast_transpose / dequantize, QTensor, PackedWeight and the scaled GEMM (FP8 A, or A
// cast inside the GEMM) of the C++ API, over numpy arrays and anything else that speaks DLPack
// (torch tensors). python/fp8kit/__init__.py wraps it (torch FP8 dtypes in and out, scaled_mm).
// Checked by tests/python/test_package.py (against ml_dtypes, PyTorch's casts and a float32 numpy
// implementation of docs/NUMERICS.md) and tests/python/test_gemm.py (float64 products within the
// float32 sum bound, torch._scaled_mm).
//
// Memory: inputs are viewed, never copied (Tensor::from_external with the array's strides; a
// kernel that needs rows in order copies a strided view itself, as in C++). Host outputs are
// fp8kit tensors handed to numpy without a copy: the array's owner is a capsule holding the
// Tensor, so the memory lives as long as either side uses it. The GIL is released around every
// kernel.
// CUDA (a build with the cuda backend): DLPack arrays on a CUDA device become Device::cuda views;
// the work is enqueued on the stream set_stream gave this thread (fp8kit.torch passes torch's
// current stream), and the outputs that matter for memory - GEMM results, quantized codes and
// scales - are written into arrays the caller allocated (`out`, quantize_into), so that they come
// from the caller's allocator (torch's caching allocator) and no call synchronises with the host.
// Errors: fp8kit::Error arrives as fp8kit.Error, a ValueError, with the C++ message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "fp8kit/fp8kit.hpp"
#include "fp8kit/version.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace fp8kit::python {
namespace {

using Array = nb::ndarray<nb::ro>;              // any dtype, shape, strides; read only
using NumpyArray = nb::ndarray<nb::numpy>;

// The fp8kit dtype of a DLPack dtype; fp8kit::Error naming the argument when there is none.
DType dtype_from_dlpack(const Array& a, const char* arg) {
    const nb::dlpack::dtype d = a.dtype();
    using code = nb::dlpack::dtype_code;
    if (d.lanes == 1) {
        switch (code(d.code)) {
            case code::Float:
                if (d.bits == 32) return DType::f32;
                if (d.bits == 16) return DType::f16;
                if (d.bits == 64) return DType::f64;
                break;
            case code::Bfloat: if (d.bits == 16) return DType::bf16; break;
            case code::UInt: if (d.bits == 8) return DType::u8; break;
            case code::Int: if (d.bits == 32) return DType::i32; break;
            case code::Float8_E4M3FN: return DType::e4m3fn;
            case code::Float8_E5M2: return DType::e5m2;
            case code::Float8_E4M3FNUZ: return DType::e4m3fnuz;
            case code::Float8_E5M2FNUZ: return DType::e5m2fnuz;
            case code::Float8_E8M0FNU: return DType::e8m0fnu;
            default: break;
        }
    }
    throw Error(std::string("fp8kit: ") + arg + " has a dtype fp8kit does not take (DLPack code " +
                std::to_string(int(d.code)) + ", " + std::to_string(int(d.bits)) + " bits)");
}

// The fp8kit device of a DLPack array: the CPU, or a CUDA device (which the library refuses,
// naming why, in a build or on a machine without the cuda backend); else fp8kit::Error.
Device device_of(const Array& a, const char* arg) {
    if (a.device_type() == nb::device::cpu::value) return Device::cpu;
    if (a.device_type() == nb::device::cuda::value) {
        try {
            (void)backend_for(Device::cuda);  // a build without the backend, or no usable GPU: why
        } catch (const Error& e) {
            throw Error(std::string("fp8kit: ") + arg + ": " + e.what());
        }
        return Device::cuda;
    }
    throw Error(std::string("fp8kit: ") + arg + " is on a device fp8kit does not take (DLPack device " +
                std::to_string(a.device_type()) + "); move it to the CPU or a CUDA device");
}

// The owner of a view that outlives the call: a reference to the array, dropped with the GIL held
// (the last user of the tensor may be C++ code that released it).
std::shared_ptr<const void> hold(const Array& a) {
    return std::shared_ptr<const void>(new Array(a), [](const void* p) {
        nb::gil_scoped_acquire gil;
        delete static_cast<const Array*>(p);
    });
}

// A view of the array's memory as an fp8kit tensor (no copy), read-only unless `writable` (an
// output; the caller checked the array is writable). Without an owner the tensor must not outlive
// the call (the argument keeps the array alive until it returns); with one (hold(a)) it may.
// `as`: the dtype to read uint8 codes as (an FP8 format), else the array's.
Tensor view(const Array& a, const char* arg, std::shared_ptr<const void> owner = nullptr,
            std::optional<DType> as = std::nullopt, bool writable = false) {
    Tensor::External e;
    e.device = device_of(a, arg);
    e.data = const_cast<void*>(a.data());
    e.dtype = dtype_from_dlpack(a, arg);
    if (as && *as != e.dtype) {
        if (e.dtype != DType::u8) {
            throw Error(std::string("fp8kit: ") + arg + " is " + std::string(to_string(e.dtype)) + ", expected " +
                        std::string(to_string(*as)) + " codes (or uint8)");
        }
        e.dtype = *as;
    }
    e.read_only = !writable;
    e.name = arg;
    for (size_t i = 0; i < a.ndim(); ++i) {
        e.shape.push_back(int64_t(a.shape(i)));
        e.strides.push_back(a.stride(i));
    }
    return Tensor::from_external(std::move(owner), std::move(e));
}

// A writable view of a caller's output array (no copy): contiguous, of dtype `want` (FP8 codes
// may come as uint8) and the shape given - what the GEMM and quantize write into. `owner`: as
// view()'s. fp8kit::Error naming `arg` otherwise.
Tensor out_view(const nb::ndarray<>& out, const char* arg, DType want, const Shape& shape, bool held = false) {
    const Array a(out);  // nanobind took `out` only if it is writable
    Tensor t = view(a, arg, held ? hold(a) : nullptr, is_fp8(want) ? std::optional(want) : std::nullopt, true);
    if (t.dtype() != want || t.shape() != shape || !t.is_contiguous()) {
        throw Error(std::string("fp8kit: ") + arg + " is " + std::string(to_string(t.dtype())) + " " +
                    to_string(t.shape()) + (t.is_contiguous() ? "" : " (strided)") + ", expected a contiguous " +
                    std::string(to_string(want)) + " " + to_string(shape));
    }
    return t;
}

// The numpy dtype of an fp8kit tensor's elements: FP8 codes and bf16 travel as their bits
// (uint8, uint16); the Python side re-views them (torch float8_*, ml_dtypes).
nb::dlpack::dtype numpy_dtype(DType d) {
    switch (d) {
        case DType::f32: return nb::dtype<float>();
        case DType::f16: return {uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
        case DType::f64: return nb::dtype<double>();
        case DType::i32: return nb::dtype<int32_t>();
        case DType::bf16: return nb::dtype<uint16_t>();
        default: return nb::dtype<uint8_t>();  // u8 and the FP8 formats
    }
}

// A numpy array over the tensor's memory (no copy): the capsule owning the array holds the
// tensor's storage. A QTensor's fields come out read-only (nb::ro): writing to them would change
// the QTensor behind its scales.
template <class... Flags>
nb::ndarray<nb::numpy, Flags...> to_numpy(const Tensor& t) {
    const Tensor c = t.contiguous();
    std::vector<size_t> shape(c.shape().begin(), c.shape().end());
    auto* owner = new Tensor(c);
    nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
    return {const_cast<void*>(c.const_raw_data()), shape.size(), shape.data(), keep, nullptr, numpy_dtype(c.dtype())};
}

// A tensor as the caller's kind of array, without a copy: a host tensor as numpy (read-only when
// `frozen`), a device tensor as a torch CUDA tensor over the same memory (DLPack; the capsule
// holds the storage): numpy has no device arrays, and CUDA arrays reach fp8kit from torch. None
// when undefined (a QTensor's optional fields).
nb::object to_object(const Tensor& t, bool frozen) {
    if (!t.defined()) return nb::none();
    if (t.device() == Device::cpu) return frozen ? nb::cast(to_numpy<nb::ro>(t)) : nb::cast(to_numpy(t));
    const Tensor c = t.contiguous();
    std::vector<size_t> shape(c.shape().begin(), c.shape().end());
    auto* owner = new Tensor(c);
    nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
    // fp8kit's device memory is on the current CUDA device, torch's current device (fp8kit.torch
    // runs each call on its tensors' device).
    const int device_id = nb::cast<int>(nb::module_::import_("torch.cuda").attr("current_device")());
    return nb::cast(nb::ndarray<nb::pytorch>(const_cast<void*>(c.const_raw_data()), shape.size(), shape.data(), keep,
                                             nullptr, numpy_dtype(c.dtype()), nb::device::cuda::value, device_id));
}

// encode / decode are the host's bulk conversions (spans, no backend): a device array is refused,
// naming the calls that do run there.
Tensor host_view(const Array& a, const char* fn, const char* arg) {
    Tensor t = view(a, arg);
    if (t.device() != Device::cpu) {
        throw Error(std::string(fn) + ": " + arg + " is on a CUDA device; " + fn +
                    " converts host arrays (on the device, quantize and dequantize run there)");
    }
    return t;
}

NumpyArray encode_array(const Array& x, const std::string& format, const std::string& overflow) {
    const Format f = parse_format(format);
    const Overflow o = parse_overflow(overflow);
    const Tensor in = host_view(x, "fp8kit.encode", "x");
    if (in.dtype() != DType::f32 && in.dtype() != DType::bf16 && in.dtype() != DType::f16) {
        throw Error("fp8kit.encode: x is " + std::string(to_string(in.dtype())) +
                    "; encode takes float32, bfloat16 or float16 (FP8 is one rounding from float32: cast "
                    "float64 to float32 first, knowing that rounds twice)");
    }
    Tensor out = Tensor::empty(in.shape(), dtype_of(f));
    {
        nb::gil_scoped_release nogil;
        const Tensor c = in.contiguous();
        const auto n = size_t(c.numel());
        const std::span<uint8_t> codes(static_cast<uint8_t*>(out.raw_data()), n);
        if (c.dtype() == DType::f32) {
            encode(std::span<const float>(c.data<const float>(), n), codes, f, o);
        } else if (c.dtype() == DType::bf16) {
            encode(std::span<const bf16>(c.data<const bf16>(), n), codes, f, o);
        } else {
            encode(std::span<const f16>(c.data<const f16>(), n), codes, f, o);
        }
    }
    return to_numpy(out);
}

NumpyArray decode_array(const Array& codes, const std::string& format, const std::string& dtype) {
    const Tensor in = host_view(codes, "fp8kit.decode", "codes");
    if (in.dtype() != DType::u8 && !is_fp8(in.dtype())) {
        throw Error("fp8kit.decode: codes is " + std::string(to_string(in.dtype())) + ", expected uint8 FP8 codes");
    }
    const Format f = parse_format(format);
    if (is_fp8(in.dtype()) && in.dtype() != dtype_of(f)) {
        throw Error("fp8kit.decode: codes are " + std::string(to_string(in.dtype())) + " but format is " + format);
    }
    const DType out_dtype = parse_dtype(dtype);
    if (out_dtype != DType::f32 && out_dtype != DType::bf16 && out_dtype != DType::f16) {
        throw Error("fp8kit.decode: dtype is " + dtype + ", expected float32, bfloat16 or float16");
    }
    Tensor out = Tensor::empty(in.shape(), out_dtype);
    {
        nb::gil_scoped_release nogil;
        const Tensor c = in.contiguous();
        const auto n = size_t(c.numel());
        const std::span<const uint8_t> src(static_cast<const uint8_t*>(c.const_raw_data()), n);
        switch (out_dtype) {
            case DType::f32: decode(src, std::span<float>(out.data<float>(), n), f); break;
            case DType::bf16: decode(src, std::span<bf16>(out.data<bf16>(), n), f); break;
            default: decode(src, std::span<f16>(out.data<f16>(), n), f); break;
        }
    }
    return to_numpy(out);
}

QuantizeOptions quantize_options(const std::string& format, const std::string& scaling, const std::string& overflow,
                                 bool power_of_two, float amax_epsilon, const std::string& mx_rounding,
                                 const std::string& non_finite) {
    QuantizeOptions o;
    o.format = parse_format(format);
    o.scaling = parse_scaling(scaling);
    o.overflow = parse_overflow(overflow);
    o.power_of_two = power_of_two;
    o.amax_epsilon = amax_epsilon;
    if (mx_rounding != "floor" && mx_rounding != "up") {
        throw Error("fp8kit.quantize: mx_rounding is '" + mx_rounding + "', expected floor or up");
    }
    o.mx_rounding = mx_rounding == "up" ? MxRounding::up : MxRounding::floor;
    if (non_finite != "propagate" && non_finite != "error") {
        throw Error("fp8kit.quantize: non_finite is '" + non_finite + "', expected propagate or error");
    }
    o.non_finite = non_finite == "error" ? NonFinite::error : NonFinite::propagate;
    return o;
}

// The caller's buffers for quantize's outputs - [data, scale_inv, amax] and with o.transpose
// [data_t, scale_inv_t] - as the QTensor that quantize() writes into (each view holds its array).
// Device arrays come this way, from torch's allocator. Each must be contiguous, of the dtype and
// shape quantize gives (fp8kit::Error naming it): quantize() would otherwise replace it.
QTensor quantize_outputs(const Tensor& x, const QuantizeOptions& o, const std::vector<nb::ndarray<>>& outs) {
    if (outs.size() != (o.transpose ? 5u : 3u)) {
        throw Error("fp8kit.quantize: outs holds " + std::to_string(outs.size()) + " arrays, expected " +
                    (o.transpose ? "5 (data, scale_inv, amax, data_t, scale_inv_t)" : "3 (data, scale_inv, amax)"));
    }
    if (x.dim() < 1) throw Error("fp8kit.quantize: x is a scalar, expected at least one dimension");
    const int64_t cols = x.size(x.dim() - 1);
    int64_t rows = 1;  // as quantize reads x: [the leading dimensions' product, the last]
    for (int64_t i = 0; i + 1 < x.dim(); ++i) rows *= x.size(i);
    const DType codes = dtype_of(o.format);
    const DType scales = o.scaling.granularity == Granularity::mx32 ? DType::e8m0fnu : DType::f32;
    const auto shape_of = [](GroupShape g) { return Shape{g.rows, g.cols}; };
    QTensor q;
    q.data = out_view(outs[0], "outs[0] (data)", codes, x.shape(), true);
    q.scale_inv = out_view(outs[1], "outs[1] (scale_inv)", scales, shape_of(o.scaling.scale_shape(rows, cols)), true);
    q.amax = out_view(outs[2], "outs[2] (amax)", DType::f32, {1}, true);
    if (o.transpose) {
        q.data_t = out_view(outs[3], "outs[3] (data_t)", codes, {cols, rows}, true);
        q.scale_inv_t = out_view(outs[4], "outs[4] (scale_inv_t)", scales, shape_of(o.scaling.scale_shape(cols, rows)), true);
    }
    return q;
}

// quantize(x, o), into the caller's buffers when `outs` are given (quantize_outputs).
QTensor quantize_array(const Array& x, const QuantizeOptions& o, const std::optional<std::vector<nb::ndarray<>>>& outs) {
    const Tensor in = view(x, "x");
    QTensor q;
    if (outs) q = quantize_outputs(in, o, *outs);
    nb::gil_scoped_release nogil;
    quantize(in, o, q);
    return q;
}

// A QTensor over a caller's FP8 codes and scales (what torch._scaled_mm and checkpoints hand
// over): viewed, not copied, and held for as long as the QTensor lives. The GEMM checks it as an
// operand (2-d, unit column stride, scale_inv's shape and dtype for the scaling) when it is used.
QTensor qtensor_from(const Array& data, const Array& scale_inv, const std::string& scaling, const std::string& format) {
    const Scaling s = parse_scaling(scaling);
    const Format f = parse_format(format);
    const DType scale_dtype = s.granularity == Granularity::mx32 ? DType::e8m0fnu : DType::f32;
    QTensor q;
    q.data = view(data, "data", hold(data), dtype_of(f));
    q.scaling = s;
    q.scale_inv = view(scale_inv, "scale_inv", hold(scale_inv), scale_dtype == DType::f32 ? std::nullopt
                                                                                           : std::optional(scale_dtype));
    if (q.scale_inv.dtype() != scale_dtype) {
        throw Error("fp8kit.QTensor: scale_inv is " + std::string(to_string(q.scale_inv.dtype())) + ", expected " +
                    std::string(to_string(scale_dtype)) + " for " + to_string(s) + " scaling");
    }
    if (q.data.dim() == 2) {  // the shape rule of quantize(); other ranks are refused where used
        const GroupShape want = s.scale_shape(q.data.size(0), q.data.size(1));
        if (q.scale_inv.shape() != Shape{want.rows, want.cols}) {
            throw Error("fp8kit.QTensor: scale_inv has shape " + to_string(q.scale_inv.shape()) + ", expected " +
                        to_string(Shape{want.rows, want.cols}) + " for " + to_string(s) + " scaling of " +
                        to_string(q.data.shape()));
        }
    }
    return q;
}

Role parse_role(const std::string& role) {
    if (role == "input") return Role::input;
    if (role == "weight") return Role::weight;
    if (role == "grad_output") return Role::grad_output;
    throw Error("fp8kit: role is '" + role + "', expected input, weight or grad_output");
}

GemmOptions gemm_options(const std::string& out_dtype, float alpha, float beta, const std::optional<Array>& c,
                         const std::optional<Array>& bias, const std::string& activation) {
    GemmOptions o;
    try {
        o.out_dtype = parse_dtype(out_dtype);
    } catch (const Error& e) {
        throw Error(std::string("fp8kit.gemm: out_dtype: ") + e.what());
    }
    o.alpha = alpha;
    o.beta = beta;
    if (c) o.c = view(*c, "c");
    if (bias) o.bias = view(*bias, "bias");
    if (activation != "none" && activation != "gelu") {
        throw Error("fp8kit.gemm: activation is '" + activation + "', expected none or gelu");
    }
    o.activation = activation == "gelu" ? Activation::gelu : Activation::none;
    return o;
}

// A Linear layer's fused-cast GEMM with all but the input fixed: the packed weight, the input's
// quantize options and the bias, parsed and viewed once - what fp8kit.torch's inference layers call on
// every forward. Why: at a decode step's small layers the per-call parsing of gemm_fused's fifteen
// arguments costs more than the GEMM. Holds the bias array, so its view stays valid.
struct FusedLinear {
    PackedWeight b;
    std::optional<QuantizeOptions> q;  // none: weight-only (x not quantized)
    std::optional<Array> bias;
    std::optional<Array> scale;  // a static input scale (q->scale views it), or none: current scaling
    GemmOptions o[3];  // by output dtype, in the order of fused_out_dtypes
};
// FusedLinear's output dtypes, by the index call_into takes (exported as
// FusedLinear.out_dtypes, from which fp8kit.torch builds its index).
constexpr const char* fused_out_dtypes[3] = {"float32", "bfloat16", "float16"};

// The FusedLinear's options for out_dtypes[dtype], once the call's arguments are checked: the
// dtype index, m and k against the weight - each an fp8kit::Error naming `what`, the method.
const GemmOptions& fused_checked(const FusedLinear& f, int64_t m, int64_t k, int dtype, const char* what) {
    if (dtype < 0 || dtype > 2) {
        throw Error(std::string(what) + ": dtype is " + std::to_string(dtype) + ", expected an index of out_dtypes: 0, 1 or 2");
    }
    if (k != f.b.k() || m < 0) {
        throw Error(std::string(what) + ": x is [" + std::to_string(m) + ", " + std::to_string(k) + "], expected [M, " +
                    std::to_string(f.b.k()) + "] (the weight's in_features)");
    }
    return f.o[dtype];
}

// y[m, N] = the FusedLinear's GEMM of x[m, k] with the options o (fused_checked's), both at raw
// addresses, C-contiguous, of o's dtype (call_into and call_each). from_external refuses null and
// misaligned addresses, so a wrong argument is an error and not a stray read. The caller releases
// the GIL.
void fused_call(const FusedLinear& f, const GemmOptions& o, uintptr_t x, int64_t m, int64_t k, void* out) {
    if (m == 0) return;  // an empty batch: y [0, N] has nothing to write (torch gives it no address)
    const DType d = o.out_dtype;
    const auto external = [&](void* p, int64_t cols, bool read_only, const char* name) {
        Tensor::External e;
        e.data = p;
        e.dtype = d;
        e.device = f.b.source().scale_inv.device();  // x and y live where the weight does (its codes may be released)
        e.shape = {m, cols};
        e.strides = {cols, 1};
        e.read_only = read_only;
        e.name = name;
        return Tensor::from_external(nullptr, std::move(e));
    };
    Tensor xt = external(reinterpret_cast<void*>(x), k, true, "x");
    const GemmA a = f.q ? GemmA(std::move(xt), *f.q) : GemmA(std::move(xt));
    const Tensor y = external(out, f.b.n(), false, "out");
    gemm(a, f.b, o, y);
}

// A checkpoint seen from the shard that holds one tensor: its lookups are the checkpoint's (a scale
// may be in another shard), its path - named by stored_weight's errors - is that shard file's.
class ShardLookup final : public TensorLookup {
public:
    ShardLookup(const Checkpoint& c, const std::string& tensor)
        : c_(c), path_(c.is_directory() ? c.path() + "/" + c.shard_files()[c.shard_of(tensor)] : c.path()) {}
    const std::string& path() const noexcept override { return path_; }
    bool contains(const std::string& name) const noexcept override { return c_.contains(name); }
    Tensor tensor(const std::string& name) const override { return c_.tensor(name); }
    const std::map<std::string, std::string>& metadata() const override { return c_.metadata(); }
    std::optional<std::string> quantization_config() const override { return c_.quantization_config(); }
    std::string quantization_config_where() const override { return c_.quantization_config_where(); }

private:
    const Checkpoint& c_;
    std::string path_;
};

// D = gemm(a, b, o): into the caller's `out` [M, N] when given (device GEMMs: torch allocates it),
// returning None; else a new host array.
int64_t b_rows(const PackedWeight& b) { return b.n(); }
int64_t b_rows(const QTensor& b) {
    if (b.data.dim() != 2) throw Error("fp8kit.gemm: b is " + to_string(b.data.shape()) + ", expected [N, K]");
    return b.data.size(0);
}

// B: a PackedWeight, or a QTensor for this call alone (fp8kit::gemm's overloads).
template <class B>
nb::object gemm_array(const GemmA& a, const B& b, const GemmOptions& o, const std::optional<nb::ndarray<>>& out) {
    if (out) {
        const Tensor& at = a.fp8 ? a.fp8->data : *a.hp;
        if (at.dim() != 2) throw Error("fp8kit.gemm: a is " + to_string(at.shape()) + ", expected [M, K]");
        const Tensor d = out_view(*out, "out", o.out_dtype, {at.size(0), b_rows(b)});
        nb::gil_scoped_release nogil;
        gemm(a, b, o, d);
        return nb::none();
    }
    Tensor d;
    {
        nb::gil_scoped_release nogil;
        d = gemm(a, b, o);
    }
    return nb::cast(to_numpy(d));
}

// gemm, gemm_fused and gemm_weight_only for one type of b.
template <class B>
void def_gemms(nb::module_& m) {
    m.def("gemm", [](const QTensor& a, const B& b, const std::string& out_dtype, float alpha, float beta,
                     const std::optional<Array>& c, const std::optional<Array>& bias, const std::string& activation,
                     const std::optional<nb::ndarray<>>& out) {
              return gemm_array(a, b, gemm_options(out_dtype, alpha, beta, c, bias, activation), out);
          },
          "a"_a, "b"_a, "out_dtype"_a = "float32", "alpha"_a = 1.0f, "beta"_a = 0.0f, "c"_a = nb::none(),
          "bias"_a = nb::none(), "activation"_a = "none", "out"_a = nb::none(),
          "D[M, N] = act(alpha * deq(a) . deq(b)^T (+ beta * c) (+ bias)), a an FP8 QTensor [M, K], b a PackedWeight or "
          "a QTensor [N, K] for this call alone; written into out (returning None) when given.");
    m.def("gemm_fused", [](const Array& a, const B& b, const std::string& format, const std::string& scaling,
                           const std::string& overflow, bool power_of_two, float amax_epsilon,
                           const std::string& mx_rounding, const std::string& non_finite, const std::string& out_dtype,
                           float alpha, float beta, const std::optional<Array>& c, const std::optional<Array>& bias,
                           const std::string& activation, const std::optional<nb::ndarray<>>& out) {
              const QuantizeOptions q = quantize_options(format, scaling, overflow, power_of_two, amax_epsilon,
                                                         mx_rounding, non_finite);
              return gemm_array(GemmA(view(a, "a"), q), b, gemm_options(out_dtype, alpha, beta, c, bias, activation), out);
          },
          "a"_a, "b"_a, "format"_a, "scaling"_a, "overflow"_a, "power_of_two"_a, "amax_epsilon"_a, "mx_rounding"_a,
          "non_finite"_a, "out_dtype"_a, "alpha"_a, "beta"_a, "c"_a.none(), "bias"_a.none(), "activation"_a,
          "out"_a = nb::none(),
          "The GEMM with a given in float32 / bfloat16 / float16 [M, K] and cast to FP8 inside it.");
    m.def("gemm_weight_only", [](const Array& a, const B& b, const std::string& out_dtype, float alpha,
                                 float beta, const std::optional<Array>& c, const std::optional<Array>& bias,
                                 const std::string& activation, const std::optional<nb::ndarray<>>& out) {
              return gemm_array(GemmA(view(a, "a")), b, gemm_options(out_dtype, alpha, beta, c, bias, activation), out);
          },
          "a"_a, "b"_a, "out_dtype"_a, "alpha"_a, "beta"_a, "c"_a.none(), "bias"_a.none(), "activation"_a,
          "out"_a = nb::none(),
          "The GEMM with a given in float32 / bfloat16 / float16 [M, K], not quantized: taken as the sum of "
          "two bfloat16 terms (weight-only FP8, fp8kit::GemmA).");
}

// A row-major tensor over a torch tensor's memory at address p (attention_decode, rms_norm).
Tensor at_address(uintptr_t p, DType t, Shape shape, bool read_only, const char* name) {
    return Tensor::from_external(nullptr, {.data = reinterpret_cast<void*>(p), .shape = std::move(shape), .strides = {},
                                           .dtype = t, .read_only = read_only, .name = name});
}

}  // namespace
}  // namespace fp8kit::python

NB_MODULE(_fp8kit, m) {
    using namespace fp8kit;
    using namespace fp8kit::python;
    m.doc() = "fp8kit: exact FP8 formats, scaling and quantization (the C++ library, through nanobind)";
    m.attr("__version__") = FP8KIT_VERSION_STRING;
    nb::exception<Error>(m, "Error", PyExc_ValueError);

    m.def("formats", [] {
        std::vector<std::string> names;
        for (const Format f : all_formats) names.emplace_back(to_string(f));
        return names;
    }, "The FP8 formats: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu.");
    m.def("format_max", [](const std::string& format) { return format_info(parse_format(format)).max; }, "format"_a,
          "The largest finite value of a format.");
    m.def("encode", &encode_array, "x"_a, "format"_a = "e4m3fn", "overflow"_a = "saturate",
          "FP8 codes (uint8, x's shape) of float32 / bfloat16 / float16 x: round to nearest even, one rounding; "
          "overflow 'saturate' (+-max) or 'nonsaturating' (Inf or NaN, as ml_dtypes and torch casts).");
    m.def("decode", &decode_array, "codes"_a, "format"_a = "e4m3fn", "dtype"_a = "float32",
          "The values of FP8 codes: float32 (exact), or bfloat16 / float16 bits (uint16 / float16).");

    // The arrays own their memory through the capsule of to_numpy: returned as they are, not tied
    // to the QTensor's lifetime (nanobind's default for properties, reference_internal).
    const auto owned = nb::rv_policy::automatic;
    nb::class_<QTensor>(m, "QTensor", "FP8 codes and the scales that bring them back (fp8kit::QTensor).")
        .def_prop_ro("data", [](const QTensor& q) { return to_object(q.data, true); }, owned,
                     "FP8 codes (uint8), the input's shape")
        .def_prop_ro("format", [](const QTensor& q) { return std::string(to_string(q.format())); })
        .def_prop_ro("shape", [](const QTensor& q) { return std::vector<int64_t>(q.data.shape().begin(), q.data.shape().end()); },
                     "data's shape")
        .def_prop_ro("device", [](const QTensor& q) { return std::string(to_string(q.data.device())); },
                     "where its tensors are: cpu or cuda")
        .def_prop_ro("scaling", [](const QTensor& q) { return to_string(q.scaling); })
        .def_prop_ro("scale_inv", [](const QTensor& q) { return to_object(q.scale_inv, true); }, owned,
                     "[scale rows, scale cols] float32, or e8m0 codes (uint8) for mx32: value = decode(code) * scale_inv")
        .def_prop_ro("amax", [](const QTensor& q) { return to_object(q.amax, true); }, owned, "[1] float32: max |x|")
        .def_prop_ro("data_t", [](const QTensor& q) { return to_object(q.data_t, true); }, owned,
                     "the transposed codes, or None")
        .def_prop_ro("scale_inv_t", [](const QTensor& q) { return to_object(q.scale_inv_t, true); }, owned)
        .def("transposed", &QTensor::transposed, nb::call_guard<nb::gil_scoped_release>(),
             "The transposed copy (quantize(x.T) with the same options) as a QTensor of its own; an error if none.")
        .def("__repr__", [](const QTensor& q) {
            return "fp8kit.QTensor(" + std::string(to_string(q.format())) + ", " + to_string(q.data.shape()) + ", " +
                   to_string(q.scaling) + (q.has_transpose() ? ", with transpose)" : ")");
        });

    m.def("quantize", [](const Array& x, const std::string& format, const std::string& scaling,
                         const std::string& overflow, bool power_of_two, float amax_epsilon,
                         const std::string& mx_rounding, const std::string& non_finite, bool transpose,
                         const std::optional<std::vector<nb::ndarray<>>>& outs) {
              QuantizeOptions o = quantize_options(format, scaling, overflow, power_of_two, amax_epsilon, mx_rounding,
                                                   non_finite);
              o.transpose = transpose;
              return quantize_array(x, o, outs);
          },
          "x"_a, "format"_a = "e4m3fn", "scaling"_a = "tensor", "overflow"_a = "saturate", "power_of_two"_a = false,
          "amax_epsilon"_a = 0.0f, "mx_rounding"_a = "floor", "non_finite"_a = "propagate", "transpose"_a = false,
          "outs"_a = nb::none(),
          "Scale per group (tensor, row, column, block(RxC), mx32) and cast: code = encode(float32(x * scale)), "
          "scale = fp8_max / amax (docs/NUMERICS.md). transpose=True also gives quantize(x.T) (cast_transpose). "
          "outs: the arrays to write [data, scale_inv, amax(, data_t, scale_inv_t)] into (device x: torch's).");
    m.def("dequantize", [](const QTensor& q, const std::string& dtype) {
              const DType d = parse_dtype(dtype);
              Tensor out;
              {
                  nb::gil_scoped_release nogil;
                  out = dequantize(q, d);
              }
              return to_object(out, false);
          },
          "q"_a, "dtype"_a = "float32", "decode(code) * scale_inv of its group, as float32 (or bfloat16 / float16 bits).");
    m.def("recipe_scalings", [](const std::string& recipe) {
              const Recipe r = parse_recipe(recipe);
              return std::vector<std::string>{to_string(r.options(Role::input).scaling),
                                              to_string(r.options(Role::weight).scaling)};
          },
          "recipe"_a, "The scalings a recipe quantizes a Linear's input and weight with: [input, weight].");
    m.def("recipe_scaling", [](const std::string& recipe, const std::string& role) {
              return to_string(parse_recipe(recipe).options(parse_role(role)).scaling);
          },
          "recipe"_a, "role"_a, "The scaling a recipe quantizes a Linear's operand of this role with.");
    m.def("recipe_quantize", [](const Array& x, const std::string& recipe, const std::string& role, bool transpose,
                                const std::optional<std::vector<nb::ndarray<>>>& outs) {
              QuantizeOptions o = parse_recipe(recipe).options(parse_role(role));
              o.transpose = transpose;
              return quantize_array(x, o, outs);
          },
          "x"_a, "recipe"_a, "role"_a, "transpose"_a = false, "outs"_a = nb::none(),
          "x quantized as a recipe quantizes a Linear's operand of this role (input, weight, grad_output): "
          "its format, scaling and options (fp8kit::Recipe::options). Not for delayed (see DelayedScaling).");
    nb::class_<DelayedScaling>(m, "DelayedScaling",
                               "Delayed scaling of one tensor (fp8kit::DelayedScaling): quantize() uses the scale of "
                               "earlier steps and records this amax; step() derives the next scale.")
        .def("__init__", [](DelayedScaling* self, const std::string& role, int history_length, int margin) {
                 new (self) DelayedScaling(Recipe::delayed(history_length, AmaxCompute::max, margin), parse_role(role));
             },
             "role"_a, "history_length"_a = 1024, "margin"_a = 0)
        .def("quantize", [](DelayedScaling& d, const Array& x, bool transpose) {
                 const Tensor in = view(x, "x");
                 nb::gil_scoped_release nogil;
                 return d.quantize(in, transpose);
             },
             "x"_a, "transpose"_a = false)
        .def("step", &DelayedScaling::step, nb::call_guard<nb::gil_scoped_release>())
        .def("restore", [](DelayedScaling& d, const Array& history, const Array& scale, bool fresh) {
                 d.restore(host_view(history, "fp8kit.DelayedScaling.restore", "amax_history"),
                           host_view(scale, "fp8kit.DelayedScaling.restore", "scale"), fresh);
             },
             "amax_history"_a, "scale"_a, "fresh"_a,
             "Puts back a state amax_history, scale and fresh read (fp8kit::DelayedScaling::restore).")
        .def_prop_ro("fresh", &DelayedScaling::fresh, "no amax recorded and no step taken yet (scale 1)")
        .def_prop_ro("scale", [](const DelayedScaling& d) { return to_numpy<nb::ro>(d.scale().clone()); }, owned)
        .def_prop_ro("amax_history", [](const DelayedScaling& d) { return to_numpy<nb::ro>(d.amax_history().clone()); },
                     owned);
    m.def("scale_shape", [](const std::string& scaling, int64_t rows, int64_t cols) {
              const GroupShape g = parse_scaling(scaling).scale_shape(rows, cols);
              return std::vector<int64_t>{g.rows, g.cols};
          },
          "scaling"_a, "rows"_a, "cols"_a, "The shape of scale_inv for a scaling of [rows, cols].");
    m.def("gemm_k_group", [](const std::string& a_scaling, const std::string& b_scaling, int64_t k) {
              return gemm_k_group(parse_scaling(a_scaling), parse_scaling(b_scaling), k);
          },
          "a_scaling"_a, "b_scaling"_a, "k"_a,
          "The K group a GEMM of A and B (K wide) sums in (fp8kit::gemm_k_group); fp8kit.Error where their scale "
          "groups along K do not nest.");
    m.def("qtensor", &qtensor_from, "data"_a, "scale_inv"_a, "scaling"_a = "tensor", "format"_a = "e4m3fn",
          "A QTensor over existing FP8 codes [rows, cols] and their scale_inv (viewed, not copied).");

    nb::class_<PackedWeight>(m, "PackedWeight",
                             "A weight B [N, K] (out, in) packed once for fp8kit's GEMM (fp8kit::PackedWeight).")
        .def(nb::init<const QTensor&>(), "q"_a, nb::call_guard<nb::gil_scoped_release>())
        .def(
            "__init__",
            [](PackedWeight* self, const QTensor& q, const std::string& a_scaling) {
                const Scaling a = parse_scaling(a_scaling);
                nb::gil_scoped_release nogil;
                new (self) PackedWeight(q, a);
            },
            "q"_a, "a_scaling"_a,
            "Packed for GEMMs whose A is scaled as a_scaling (e.g. 'block(1x32)'): K in the groups both "
            "scalings nest in, so such a GEMM needs no repacking (nor the codes, once released).")
        .def_prop_ro("k_group", &PackedWeight::k_group, "the K group the layout is packed for")
        .def_prop_ro("n", &PackedWeight::n)
        .def_prop_ro("k", &PackedWeight::k)
        .def_prop_ro("packed_bytes", &PackedWeight::packed_bytes, "memory the packed layout takes beyond the codes")
        .def_prop_ro("source", &PackedWeight::source, "the QTensor it was packed from (data None once codes_released)")
        .def_prop_ro("codes_released", &PackedWeight::codes_released)
        .def("release_codes", &PackedWeight::release_codes,
             "Lets the source's codes go: the packed layout becomes the weight's only copy (cpu backend).")
        .def("codes_into",
             [](const PackedWeight& w, const nb::ndarray<>& out) {
                 const Tensor t = out_view(out, "out", dtype_of(w.format()), Shape{w.n(), w.k()});
                 nb::gil_scoped_release nogil;
                 w.codes_into(t);
             },
             "out"_a,
             "Writes the codes [N, K] into out (host, contiguous, the weight's FP8 dtype): the source's, or "
             "read back from the packed layout once released.")
        .def("__repr__", [](const PackedWeight& w) {
            return "fp8kit.PackedWeight(" + std::string(to_string(w.format())) + ", [" + std::to_string(w.n()) +
                   ", " + std::to_string(w.k()) + "], " + to_string(w.source().scaling) + ")";
        });
    nb::implicitly_convertible<QTensor, PackedWeight>();

    def_gemms<QTensor>(m);  // first: a QTensor b is taken for the call, not converted to a PackedWeight
    def_gemms<PackedWeight>(m);
    nb::class_<FusedLinear>(m, "FusedLinear",
                            "y = deq(fp8(x)) . deq(b)^T (+ bias) with everything but x fixed (fp8kit.torch's Linear); "
                            "scaling 'none': y = x . deq(b)^T, x not quantized (weight-only).")
        .def_prop_ro_static("out_dtypes", [](nb::handle) {
            return nb::make_tuple(fused_out_dtypes[0], fused_out_dtypes[1], fused_out_dtypes[2]);
        }, "The output dtypes' names, by the index call_into takes.")
        .def("__init__",
             [](FusedLinear* self, const PackedWeight& b, const std::string& format, const std::string& scaling,
                const std::string& overflow, const std::optional<Array>& bias, const std::optional<Array>& scale,
                const std::string& activation) {
                 std::optional<QuantizeOptions> q;  // scaling "none": weight-only
                 if (scaling != "none") q = quantize_options(format, scaling, overflow, false, 0.0f, "floor", "propagate");
                 if (scale) {  // a static input scale: checked now, not at the first call
                     if (!q) throw Error("fp8kit.FusedLinear: a static scale needs an input scaling, got 'none'");
                     if (q->scaling.granularity != Granularity::tensor) {
                         throw Error("fp8kit.FusedLinear: a static scale needs tensor input scaling, got " + scaling);
                     }
                     q->scale = view(*scale, "scale", hold(*scale)).contiguous();
                     const float v = q->scale.numel() == 1 && q->scale.dtype() == DType::f32 ? *q->scale.data<const float>() : 0.0f;
                     if (!(v > 0.0f) || std::isinf(v)) {
                         throw Error("fp8kit.FusedLinear: scale is " + std::string(to_string(q->scale.dtype())) + " " +
                                     to_string(q->scale.shape()) + (q->scale.numel() == 1 ? " holding " + std::to_string(v) : "") +
                                     ", expected one finite float32 value > 0");
                     }
                 }
                 auto* f = new (self) FusedLinear{b, q, bias, scale, {}};
                 for (int i = 0; i < 3; ++i) {
                     f->o[i] = gemm_options(fused_out_dtypes[i], 1.0f, 0.0f, std::nullopt, f->bias, activation);
                 }
             },
             "b"_a, "format"_a, "scaling"_a, "overflow"_a, "bias"_a.none(), "scale"_a = nb::none(),
             "activation"_a = "none",
             "scale: a static input scale (one float32 value, x * scale is cast; tensor scaling only), as a "
             "checkpoint's input_scale gives it (scale = 1 / input_scale); None: the scale of each call's amax. "
             "activation: 'none', or 'gelu' (tanh form) applied to y in the GEMM's epilogue.")
        // fp8kit.torch's eager forward: a torch tensor reaches nanobind only through DLPack (a
        // capsule a tensor, costlier than a decode step's small GEMM) or numpy (which would pin its
        // storage), so its Linear passes the addresses of x and of the y it allocated instead. The
        // caller guarantees what an array would have told: both on the weight's device (the CPU,
        // or the current CUDA device, where the GEMM is ordered on set_stream's stream),
        // C-contiguous, [m, k] and [m, n] of out_dtypes[dtype], alive for the call. Checked here:
        // k against the weight, m and the dtype index (from_external: null and misaligned
        // addresses), so a wrong shape is an error and not a stray read.
        .def("call_into",
             [](const FusedLinear& f, uintptr_t x, int64_t rows, int64_t k, int dtype, uintptr_t out) {
                 const GemmOptions& o = fused_checked(f, rows, k, dtype, "fp8kit.FusedLinear.call_into");
                 nb::gil_scoped_release nogil;
                 fused_call(f, o, x, rows, k, reinterpret_cast<void*>(out));
             },
             "x"_a, "m"_a, "k"_a, "dtype"_a, "out"_a,
             "y[m, n] = D for x[m, k] at address x, written at address out, both C-contiguous in out_dtypes[dtype] "
             "(fp8kit.torch's eager path; the caller keeps both alive).")
        .def_prop_ro("weight", [](FusedLinear& f) -> PackedWeight& { return f.b; }, nb::rv_policy::reference_internal,
                     "its PackedWeight (the FusedLinear's own: release_codes here releases them for its GEMMs)");
    // fp8kit.torch's siblings (layers a model calls in a row on one input): their GEMMs of one x in
    // one call, each into its own output, from the layers' own packed weights - no stacked copy of
    // them. Why one call: a decode step's small GEMM costs less than the way from Python to it,
    // and each weight stream evicts the interpreter's working set from L2, so the GEMMs run back to
    // back and Python resumes once.
    m.def("call_each",
          [](const std::vector<const FusedLinear*>& fs, uintptr_t x, int64_t rows, int64_t k, int dtype,
             const std::vector<uintptr_t>& outs) {
              const char* what = "fp8kit.call_each";
              if (outs.size() != fs.size()) {
                  throw Error(std::string(what) + ": " + std::to_string(outs.size()) + " outputs for " +
                              std::to_string(fs.size()) + " layers");
              }
              std::vector<const GemmOptions*> o;  // every layer checked before the first GEMM
              for (const FusedLinear* f : fs) {
                  if (f == nullptr) throw Error(std::string(what) + ": a layer is None");
                  o.push_back(&fused_checked(*f, rows, k, dtype, what));
              }
              nb::gil_scoped_release nogil;
              for (size_t i = 0; i < fs.size(); ++i) fused_call(*fs[i], *o[i], x, rows, k, reinterpret_cast<void*>(outs[i]));
          },
          "layers"_a, "x"_a, "m"_a, "k"_a, "dtype"_a, "outs"_a,
          "FusedLinear.call_into of each layer on the same x[m, k], layer i's D written at address outs[i] (C-contiguous "
          "[m, n_i] in out_dtypes[dtype]); every layer's shape and the dtype checked before the first GEMM.");
    // fp8kit.torch's attention function (fp8kit/torch/attention.py): attention_decode on the
    // addresses of torch's tensors, as call_into takes x (a DLPack capsule a tensor would cost more
    // than a layer's decode-step attention). The caller guarantees what an array would have told:
    // all on the host, C-contiguous, of `dtype`, q [b, hq, s, d], k and v [b, hkv, l, d], mask 0
    // (none) or bool [mask_b, s, l], out [b, s, hq, d], alive for the call, none empty. Checked
    // here: the shapes' relations (attention_decode), null and misaligned addresses.
    m.def("attention_decode",
          [](uintptr_t out, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t mask, const std::string& dtype,
             std::array<int64_t, 4> q_shape, int64_t hkv, int64_t l, int64_t mask_b, double scale) {
              const DType dt = parse_dtype(dtype);
              const int64_t b = q_shape[0], hq = q_shape[1], s = q_shape[2], d = q_shape[3];
              const Tensor o = at_address(out, dt, {b, s, hq, d}, false, "out");
              const Tensor qt = at_address(q, dt, {b, hq, s, d}, true, "q");
              const Tensor kt = at_address(k, dt, {b, hkv, l, d}, true, "k");
              const Tensor vt = at_address(v, dt, {b, hkv, l, d}, true, "v");
              const Tensor mt = mask ? at_address(mask, DType::boolean, {mask_b, s, l}, true, "mask") : Tensor();
              nb::gil_scoped_release nogil;
              attention_decode(o, qt, kt, vt, mt, scale);
          },
          "out"_a, "q"_a, "k"_a, "v"_a, "mask"_a, "dtype"_a, "q_shape"_a, "hkv"_a, "l"_a, "mask_b"_a, "scale"_a,
          "attention_decode at raw host addresses, all C-contiguous: out [b, s, hq, d] = softmax(scale q k^T, masked) v for "
          "q [b, hq, s, d] (q_shape), k and v [b, hkv, l, d], mask 0 or bool [mask_b, s, l] (fp8kit.torch's attention; the "
          "caller keeps all alive).");
    // fp8kit.torch's RMSNorm (fp8kit/torch/layernorm.py): rmsnorm_forward at the addresses of
    // torch's tensors, as attention_decode takes them. The caller guarantees: on the host,
    // C-contiguous, of `dtype`, x and out [rows, c], weight [c], alive for the call, none empty.
    m.def("rms_norm",
          [](uintptr_t out, uintptr_t x, uintptr_t weight, const std::string& dtype, int64_t rows, int64_t c, double eps) {
              const DType dt = parse_dtype(dtype);
              const Tensor o = at_address(out, dt, {rows, c}, false, "out");
              const Tensor xt = at_address(x, dt, {rows, c}, true, "x");
              const Tensor wt = at_address(weight, dt, {c}, true, "weight");
              const Tensor rstd = Tensor::empty({rows}, dt);  // the backward's; not kept
              nb::gil_scoped_release nogil;
              rmsnorm_forward(o, rstd, xt, wt, eps);
          },
          "out"_a, "x"_a, "weight"_a, "dtype"_a, "rows"_a, "c"_a, "eps"_a,
          "rmsnorm_forward at raw host addresses, all C-contiguous: out [rows, c] = round(x * rstd) * weight, rstd = "
          "1 / sqrt(mean(x^2) + eps) (fp8kit.torch's RMSNorm; the caller keeps all alive).");
    // (name, fp8, recipe, reason) per layer
    using PolicyEntry = std::tuple<std::string, bool, std::optional<std::string>, std::string>;
    m.def("write_policy", [](const std::string& path, const std::vector<PolicyEntry>& layers) {
              Policy p;
              for (const auto& [name, fp8, recipe, reason] : layers) {
                  PolicyLayer l;
                  l.name = name;
                  l.fp8 = fp8;
                  if (recipe) l.set_recipe(*recipe);
                  if (l.fp8 && !l.scheme) {
                      throw Error("fp8kit.write_policy: layer '" + name + "' is fp8 but names no recipe");
                  }
                  l.reason = reason;
                  p.layers.push_back(std::move(l));
              }
              write_policy(path, p);
          },
          "path"_a, "layers"_a,
          "Writes a policy file (docs/CHECKPOINTS.md) of (weight name, fp8, recipe or None, reason) entries, "
          "replace-on-write.");
    m.def("read_policy", [](const std::string& path) { return policy_json(read_policy(path)); }, "path"_a,
          "A policy file as the library reads it (its JSON, normalized); fp8kit.Error naming what is malformed.");
    // fp8kit.torch's checkpoint loader reads the layouts through the library's own rules
    // (stored_weight: the same as fp8kit inspect / dequantize / verify), not a copy of them.
    using StoredEntry = std::tuple<std::string, std::vector<int64_t>, std::string, std::string, std::string, std::string,
                                   std::string>;
    m.def("checkpoint_weights", [](const std::string& path) {
              const Checkpoint c(path);
              std::vector<StoredEntry> out;
              std::vector<std::string> layout;
              for (const std::string& name : c.names()) {
                  const ShardLookup t(c, name);
                  if (is_scale_name(t, name)) layout.push_back(name);
                  const std::optional<StoredWeight> w = stored_weight(t, name);
                  if (!w) continue;
                  out.emplace_back(name, std::vector<int64_t>(w->shape.begin(), w->shape.end()),
                                   std::string(to_string(w->scheme)), w->scale, to_string(w->q.scaling), w->input_scale,
                                   c.is_directory() ? c.shard_files()[c.shard_of(name)] : path);
              }
              return std::make_tuple(c.quantization_config(), out, layout);
          },
          "path"_a,
          "The FP8 weights of a checkpoint (a safetensors file or a shard directory) as fp8kit's commands read them: "
          "(quantization_config JSON or None, [(weight name, its shape, scheme, scale tensor's name, the scaling of "
          "its matrix view [rows, cols], input_scale name or '', the file holding it)], [the names of the tensors "
          "that belong to those weights' layout, not to a model: scales, ComfyUI's scale_input and scaled_fp8 "
          "marker (fp8kit::is_scale_name)]); fp8kit.Error naming the file and tensor for a scale no layout explains.");
    // fp8kit.torch's messages show what files hold as the library's do (fp8kit/files.hpp): one way.
    m.def("quote_printable", [](const nb::bytes& text) { return quote_printable(std::string_view(text.c_str(), text.size())); },
          "text"_a, "UTF-8 bytes (a name or value from a file) quoted as the library's messages show them: control "
          "characters as \\xHH, \\n, \\t or \\r, cut after 200 bytes with the length in bytes.");
    m.def("first_nonfinite_code", [](const Array& codes, const std::string& format) -> std::optional<int64_t> {
              const Tensor c = view(codes, "codes", nullptr, dtype_of(parse_format(format)));
              if (c.device() != Device::cpu) throw Error("fp8kit.first_nonfinite_code: codes is not a host array");
              nb::gil_scoped_release nogil;
              return first_nonfinite_code(c);
          },
          "codes"_a, "format"_a,
          "The flat index of the first code of an FP8 weight (uint8 codes in `format`) that is not a number (NaN, "
          "e5m2's Inf), or None (fp8kit::first_nonfinite_code): what fp8kit.torch's checkpoint loader refuses.");
    m.def("set_num_threads", &set_num_threads, "n"_a, "Threads for fp8kit's kernels (1 <= n <= 4096).");
#ifdef FP8KIT_HAS_CUDA
    m.attr("cuda_built") = true;
#else
    m.attr("cuda_built") = false;
#endif
    m.def("cuda_available", [] { return backend_available(Backend::cuda); },
          "Whether CUDA tensors can be used: a build with the cuda backend, and a GPU with its driver.");
    // The stream this thread's device work is enqueued on until the next call (fp8kit.torch passes
    // torch's current stream before each device call): a ContextGuard kept per thread, as torch
    // keeps a current stream per thread.
    m.def("set_stream", [](uintptr_t stream) {
              thread_local std::optional<ContextGuard> current;
              current.reset();
              current.emplace(ExecContext{reinterpret_cast<void*>(stream)});
          },
          "stream"_a, "The cudaStream_t (as an int; 0: the default stream) this thread's CUDA work runs on.");
    m.def("num_threads", &num_threads);
}
