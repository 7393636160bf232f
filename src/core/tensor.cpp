// src/core/tensor.cpp: DType names and the Tensor model (storage, views, copies, element access).
// Checked by tests/unit/test_tensor.cpp.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "core/host_memory.hpp"
#include "core/ops.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit {

// ---- DType ----

namespace {
constexpr std::string_view plain_names[] = {"f32", "bf16", "f16", "u8",  "i32", "f64", "i8",
                                             "i16", "i64",  "u16", "u32", "u64", "bool"};
}

std::string_view to_string(DType d) noexcept {
    if (is_fp8(d)) return to_string(Format(uint8_t(d)));
    return plain_names[uint8_t(d) - uint8_t(DType::f32)];
}

std::optional<DType> try_parse_dtype(std::string_view name) noexcept {
    for (size_t i = 0; i < std::size(plain_names); ++i) {
        if (plain_names[i] == name) return DType(uint8_t(DType::f32) + i);
    }
    if (name == "float32") return DType::f32;
    if (name == "bfloat16") return DType::bf16;
    if (name == "float16") return DType::f16;
    if (name == "float64") return DType::f64;
    if (auto f = try_parse_format(name)) return dtype_of(*f);
    return std::nullopt;
}

DType parse_dtype(std::string_view name) {
    if (auto d = try_parse_dtype(name)) return *d;
    throw Error("unknown dtype " + quote_printable(name) +
                ", expected f32, bf16, f16, f64, i8, i16, i32, i64, u8, u16, u32, u64, bool or an FP8 format (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu)");
}

Format format_of(DType d) {
    if (!is_fp8(d)) throw Error("dtype " + std::string(to_string(d)) + " is not an FP8 format");
    return Format(uint8_t(d));
}

std::string_view to_string(Device d) noexcept { return d == Device::cpu ? "cpu" : "cuda"; }

std::string to_string(const Shape& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// ---- Tensor ----

namespace {

int64_t count(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

Shape row_major_strides(const Shape& shape) {
    Shape strides(shape.size());
    int64_t s = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        strides[i] = s;
        s *= std::max<int64_t>(shape[i], 1);
    }
    return strides;
}

void check_shape(const Shape& shape, const char* fn) {
    for (int64_t d : shape) {
        if (d < 0) throw Error(std::string("fp8kit::Tensor::") + fn + ": shape " + to_string(shape) + " has a negative dimension");
    }
}

// The bytes of a tensor of `shape` (dimensions checked) and `dtype`; fp8kit::Error where they pass
// 2^62, which no memory holds - checked before the product wraps around (a view claiming 2^31 x
// 2^31 elements would otherwise allocate a few bytes and be written far past them).
size_t checked_bytes(const Shape& shape, DType dtype, const char* fn) {
    constexpr uint64_t most = uint64_t(1) << 62;
    if (std::find(shape.begin(), shape.end(), int64_t(0)) != shape.end()) return 0;
    uint64_t bytes = dtype_size(dtype);
    for (int64_t d : shape) {
        if (bytes > most / uint64_t(d)) {
            throw Error(std::string("fp8kit::Tensor::") + fn + ": shape " + to_string(shape) + " of " +
                        std::string(to_string(dtype)) + " takes more than 2^62 bytes");
        }
        bytes *= uint64_t(d);
    }
    return size_t(bytes);
}

}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
    check_shape(shape, "empty");
    Tensor t;
    // At least one aligned line, so that an empty tensor is still defined().
    const size_t bytes = std::max<size_t>(checked_bytes(shape, dtype, "empty"), tensor_alignment);
    if (device != Device::cpu) {
        t.storage_ = detail::device_memory(device, "empty").allocate(detail::round_up(bytes, tensor_alignment));
    } else {
        t.storage_ = detail::host_allocate(bytes);  // rounds up itself
    }
    t.strides_ = row_major_strides(shape);
    t.shape_ = std::move(shape);
    t.dtype_ = dtype;
    t.device_ = device;
    return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
    Tensor t = empty(std::move(shape), dtype, device);
    t.fill_zero();
    return t;
}

void Tensor::fill_zero() const {
    if (!is_contiguous()) throw Error("fp8kit::Tensor::fill_zero: the tensor of shape " + to_string(shape_) + " is not contiguous");
    void* p = raw_data();  // an Error for read-only memory
    if (device_ != Device::cpu) {
        detail::device_memory(device_, "fill_zero").zero(p, nbytes());
        return;
    }
    std::memset(p, 0, nbytes());
}

Tensor Tensor::full(Shape shape, float value, DType dtype) {
    Tensor t = empty(std::move(shape), dtype);
    const int64_t n = t.numel();
    if (n == 0) return t;
    const Tensor flat = t.reshape({n});
    flat.set({0}, value);  // converts (and checks) once, then copies the element's bytes
    const size_t es = dtype_size(dtype);
    auto* p = static_cast<std::byte*>(t.raw_data());
    for (int64_t i = 1; i < n; ++i) std::memcpy(p + i * int64_t(es), p, es);
    return t;
}

template <class T>
Tensor Tensor::from(std::span<const T> values, Shape shape) {
    check_shape(shape, "from");
    if (int64_t(values.size()) != count(shape)) {
        throw Error("fp8kit::Tensor::from: " + std::to_string(values.size()) + " values for shape " +
                    to_string(shape) + ", expected " + std::to_string(count(shape)));
    }
    constexpr DType d = element_dtype_v<T>;
    Tensor t = empty(std::move(shape), d);
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size_bytes());
    return t;
}
template Tensor Tensor::from(std::span<const float>, Shape);
template Tensor Tensor::from(std::span<const bf16>, Shape);
template Tensor Tensor::from(std::span<const f16>, Shape);
template Tensor Tensor::from(std::span<const uint8_t>, Shape);
template Tensor Tensor::from(std::span<const int32_t>, Shape);
template Tensor Tensor::from(std::span<const double>, Shape);
template Tensor Tensor::from(std::span<const int8_t>, Shape);
template Tensor Tensor::from(std::span<const int16_t>, Shape);
template Tensor Tensor::from(std::span<const int64_t>, Shape);
template Tensor Tensor::from(std::span<const uint16_t>, Shape);
template Tensor Tensor::from(std::span<const uint32_t>, Shape);
template Tensor Tensor::from(std::span<const uint64_t>, Shape);

Tensor Tensor::view_of(std::shared_ptr<const void> owner, const void* data, Shape shape, DType dtype, std::string name) {
    return from_external(std::move(owner), {const_cast<void*>(data), std::move(shape), {}, dtype, Device::cpu, true,
                                            std::move(name)});
}

Tensor Tensor::from_external(std::shared_ptr<const void> owner, External m) {
    // The message's prefix is built only on error: fp8kit.torch wraps two tensors a call.
    const auto where = [&m] {
        return "fp8kit::Tensor::from_external" + (m.name.empty() ? std::string() : " (" + quote_printable(m.name) + ")") + ": ";
    };
    check_shape(m.shape, "from_external");
    if (m.strides.empty()) m.strides = row_major_strides(m.shape);
    if (m.strides.size() != m.shape.size()) {
        throw Error(where() + "strides " + to_string(m.strides) + " do not match shape " + to_string(m.shape));
    }
    for (int64_t s : m.strides) {
        if (s < 0) throw Error(where() + "stride " + std::to_string(s) + " is negative (copy such an array first)");
    }
    if (m.data == nullptr) {
        if (count(m.shape) != 0) throw Error(where() + "data is null");
        // No elements, no address (DLPack gives null for torch's empty tensors): a small block of
        // its own, so that the tensor is defined and shares storage with no other tensor.
        auto block = std::make_shared<std::max_align_t>();
        m.data = block.get();
        owner = std::move(block);
    }
    if (reinterpret_cast<uintptr_t>(m.data) % dtype_size(m.dtype) != 0) {
        throw Error(where() + "data is not aligned to its " + std::to_string(dtype_size(m.dtype)) + "-byte elements (" +
                    std::string(to_string(m.dtype)) + ")");
    }
    Tensor t;
    // The aliasing constructor: t's storage points at data and owns a share of owner. An owner
    // that is empty still needs a control block, so that the tensor is defined(): one shared by
    // all of them.
    static const std::shared_ptr<const void> no_owner = std::make_shared<int>(0);
    if (!owner) owner = no_owner;
    t.storage_ = std::shared_ptr<std::byte>(std::move(owner), static_cast<std::byte*>(m.data));
    t.strides_ = std::move(m.strides);
    t.shape_ = std::move(m.shape);
    t.dtype_ = m.dtype;
    t.device_ = m.device;
    t.read_only_ = m.read_only;
    if (!m.name.empty()) t.name_ = std::make_shared<const std::string>(std::move(m.name));
    return t;
}

const std::string& Tensor::name() const noexcept {
    static const std::string none;
    return name_ ? *name_ : none;
}

int64_t Tensor::size(int64_t d) const {
    const int64_t n = dim();
    if (d < -n || d >= n) {
        throw Error("fp8kit::Tensor::size: dimension " + std::to_string(d) + " of a " + std::to_string(n) + "-d tensor");
    }
    return shape_[size_t(d < 0 ? d + n : d)];
}

int64_t Tensor::numel() const noexcept { return defined() ? count(shape_) : 0; }

bool Tensor::is_contiguous() const noexcept {
    if (numel() == 0) return true;  // no element out of place, whatever the strides (torch's [32, 0] has [1, 1])
    int64_t s = 1;
    for (size_t i = shape_.size(); i-- > 0;) {
        if (shape_[i] != 1 && strides_[i] != s) return false;
        s *= shape_[i];
    }
    return true;
}

const void* Tensor::const_raw_data() const noexcept {
    return storage_.get() + offset_ * int64_t(dtype_size(dtype_));
}

void* Tensor::raw_data() const {
    check_writable("raw_data");
    return const_cast<void*>(const_raw_data());
}

void Tensor::check_writable(const char* fn) const {
    if (read_only_) {
        throw Error(std::string("fp8kit::Tensor::") + fn + ": tensor " + (name().empty() ? "" : quote_printable(name()) + " ") +
                    to_string(shape_) + " " + std::string(to_string(dtype_)) +
                    " views read-only memory; read it with data<const T>() or write to a clone()");
    }
}

void Tensor::check_access(bool type_ok, size_t elem_size, bool write) const {
    if (!defined()) throw Error("fp8kit::Tensor::data: the tensor is undefined");
    if (!type_ok) {
        throw Error("fp8kit::Tensor::data: element type of " + std::to_string(elem_size) +
                    " bytes does not hold dtype " + std::string(to_string(dtype_)));
    }
    if (device_ != Device::cpu) throw Error("fp8kit::Tensor::data: the tensor is on device cuda, not in host memory");
    if (write) check_writable("data");
}

Tensor Tensor::reshape(Shape shape) const {
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1 && infer < 0) {
            infer = int64_t(i);
        } else if (shape[i] < 0) {
            throw Error("fp8kit::Tensor::reshape: bad shape " + to_string(shape));
        } else {
            known *= shape[i];
        }
    }
    if (infer >= 0 && known > 0) shape[size_t(infer)] = numel() / known;
    if (count(shape) != numel() || (infer >= 0 && known == 0)) {
        throw Error("fp8kit::Tensor::reshape: shape " + to_string(shape) + " does not hold the " +
                    std::to_string(numel()) + " elements of " + to_string(shape_));
    }
    if (!is_contiguous()) throw Error("fp8kit::Tensor::reshape: the tensor is not contiguous (call contiguous() first)");
    Tensor t = *this;
    t.strides_ = row_major_strides(shape);
    t.shape_ = std::move(shape);
    return t;
}

Tensor Tensor::slice(int64_t d, int64_t begin, int64_t end) const {
    const size_t k = size_t(d < 0 ? d + dim() : d);
    const int64_t n = size(d);
    if (begin < 0 || end < begin || end > n) {
        throw Error("fp8kit::Tensor::slice: [" + std::to_string(begin) + ", " + std::to_string(end) +
                    ") is not a range of dimension " + std::to_string(d) + " (size " + std::to_string(n) + ")");
    }
    Tensor t = *this;
    t.offset_ += begin * strides_[k];
    t.shape_[k] = end - begin;
    return t;
}

Tensor Tensor::transpose() const {
    if (dim() != 2) throw Error("fp8kit::Tensor::transpose: expected a 2-d tensor, got shape " + to_string(shape_));
    Tensor t = *this;
    std::swap(t.shape_[0], t.shape_[1]);
    std::swap(t.strides_[0], t.strides_[1]);
    return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
    Tensor t = empty(shape_, dtype_, device_);
    if (device_ != Device::cpu) {
        t.copy_from_device(*this);
        return t;
    }
    const size_t es = dtype_size(dtype_);
    const auto* src = static_cast<const std::byte*>(const_raw_data());
    auto* dst = static_cast<std::byte*>(t.raw_data());
    // Walk the elements in row-major order, copying runs along the last dimension.
    const int64_t n = numel();
    if (n == 0) return t;
    const int64_t inner = shape_.back(), inner_stride = strides_.back();
    Shape index(shape_.size(), 0);
    for (int64_t done = 0; done < n; done += inner) {
        int64_t off = 0;
        for (size_t i = 0; i + 1 < shape_.size(); ++i) off += index[i] * strides_[i];
        for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + (done + j) * int64_t(es), src + (off + j * inner_stride) * int64_t(es), es);
        for (size_t i = shape_.size() - 1; i-- > 0;) {
            if (++index[i] < shape_[i]) break;
            index[i] = 0;
        }
    }
    return t;
}

Tensor Tensor::to(Device device) const {
    if (!defined()) throw Error("fp8kit::Tensor::to: the tensor is undefined");
    if (device == device_) return contiguous();
    const Tensor src = contiguous();  // on its own device
    Tensor t = empty(shape_, dtype_, device);
    detail::device_memory(device != Device::cpu ? device : device_, "to")
        .copy_2d(t.raw_data(), src.nbytes(), src.const_raw_data(), src.nbytes(), src.nbytes(), 1, true);  // host side
    return t;
}

// A device tensor copied into this contiguous one: a contiguous one of any rank in one piece, else
// its rows (at most 2 dimensions, unit last stride).
void Tensor::copy_from_device(const Tensor& src) const {
    const size_t es = dtype_size(src.dtype_);
    const bool flat = src.is_contiguous();
    const bool rows_ok = flat || (src.dim() <= 1 ? (src.dim() == 0 || src.strides_[0] == 1 || src.shape_[0] <= 1)
                                                 : src.dim() == 2 && (src.strides_[1] == 1 || src.shape_[1] <= 1));
    if (!rows_ok) {
        throw Error("fp8kit::Tensor::clone: a device tensor of shape " + to_string(src.shape_) +
                    " with these strides is not copied on the device; copy it to the host first");
    }
    if (src.numel() == 0) return;
    const int64_t rows = !flat && src.dim() == 2 ? src.shape_[0] : 1;
    const int64_t cols = flat ? src.numel() : src.dim() == 0 ? 1 : src.shape_.back();
    const int64_t ld = !flat && src.dim() == 2 ? src.strides_[0] : cols;
    detail::device_memory(src.device_, "clone")
        .copy_2d(raw_data(), size_t(cols) * es, src.const_raw_data(), size_t(ld) * es, size_t(cols) * es, size_t(rows),
                 false);  // device to device: ordered on the stream
}

int64_t Tensor::element_offset(std::initializer_list<int64_t> index) const {
    if (int64_t(index.size()) != dim()) {
        throw Error("fp8kit::Tensor: index of " + std::to_string(index.size()) + " values for a " +
                    std::to_string(dim()) + "-d tensor");
    }
    int64_t off = 0;
    size_t k = 0;
    for (int64_t i : index) {
        if (i < 0 || i >= shape_[k]) {
            throw Error("fp8kit::Tensor: index " + std::to_string(i) + " out of range for dimension " +
                        std::to_string(k) + " of shape " + to_string(shape_));
        }
        off += i * strides_[k++];
    }
    return off;
}

float Tensor::get(std::initializer_list<int64_t> index) const {
    const int64_t off = element_offset(index);
    switch (dtype_) {
        case DType::f32: return data<const float>()[off];
        case DType::bf16: return float(data<const bf16>()[off]);
        case DType::f16: return float(data<const f16>()[off]);
        case DType::i32: return float(data<const int32_t>()[off]);
        case DType::u8: case DType::boolean: return float(data<const uint8_t>()[off]);
        case DType::f64: return float(data<const double>()[off]);
        case DType::i8: return float(data<const int8_t>()[off]);
        case DType::i16: return float(data<const int16_t>()[off]);
        case DType::i64: return float(data<const int64_t>()[off]);
        case DType::u16: return float(data<const uint16_t>()[off]);
        case DType::u32: return float(data<const uint32_t>()[off]);
        case DType::u64: return float(data<const uint64_t>()[off]);
        default: return decode(data<const uint8_t>()[off], format_of(dtype_));
    }
}

void Tensor::set(std::initializer_list<int64_t> index, float value) const {
    const int64_t off = element_offset(index);
    const auto integer = [&](double lo, double hi) {
        if (!(value >= lo && value <= hi) || std::nearbyint(value) != value) {
            throw Error("fp8kit::Tensor::set: " + std::to_string(value) + " is not a " + std::string(to_string(dtype_)) + " value");
        }
    };
    switch (dtype_) {
        case DType::f32: data<float>()[off] = value; break;
        case DType::bf16: data<bf16>()[off] = bf16(value); break;
        case DType::f16: data<f16>()[off] = f16(value); break;
        case DType::i32: integer(-2147483648.0, 2147483647.0); data<int32_t>()[off] = int32_t(value); break;
        case DType::u8: integer(0, 255); data<uint8_t>()[off] = uint8_t(value); break;
        case DType::boolean: integer(0, 1); data<uint8_t>()[off] = uint8_t(value); break;
        case DType::f64: data<double>()[off] = double(value); break;
        case DType::i8: integer(-128, 127); data<int8_t>()[off] = int8_t(value); break;
        case DType::i16: integer(-32768, 32767); data<int16_t>()[off] = int16_t(value); break;
        // 2^63 and 2^64 are floats; the largest floats below them are in range.
        case DType::i64: integer(-0x1p63, 0x1p63 - 0x1p39); data<int64_t>()[off] = int64_t(value); break;
        case DType::u16: integer(0, 65535); data<uint16_t>()[off] = uint16_t(value); break;
        case DType::u32: integer(0, 4294967295.0); data<uint32_t>()[off] = uint32_t(value); break;
        case DType::u64: integer(0, 0x1p64 - 0x1p40); data<uint64_t>()[off] = uint64_t(value); break;
        default: data<uint8_t>()[off] = encode(value, format_of(dtype_)); break;
    }
}

}  // namespace fp8kit
