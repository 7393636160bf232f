// fp8kit/tensor.hpp: a dense tensor - dtype, shape, row-major strides, device, and storage that
// views share (64-byte aligned, freed with the last tensor that uses it).
//
// Strides are in elements. Tensors made by empty()/zeros()/from() are contiguous (row-major);
// reshape(), slice() and transpose() return views of the same storage without copying, and
// contiguous() / clone() copy. Element access (get/set, at) is for tests and small programs,
// not for inner loops: use data<T>() there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fp8kit/dtype.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit {

enum class Device : uint8_t { cpu, cuda };
std::string_view to_string(Device d) noexcept;

using Shape = std::vector<int64_t>;
std::string to_string(const Shape& shape);  // "[17, 33]"

inline constexpr size_t tensor_alignment = 64;  // bytes: one cache line, one AVX-512 register

class Tensor {
public:
    Tensor() = default;  // undefined (no storage); defined() is false

    // Uninitialised / zero-filled contiguous tensors. Dimensions must be >= 0. Device::cuda
    // needs the CUDA backend (fp8kit::Error without it).
    static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu);
    static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu);
    // A contiguous CPU copy of `values` (values.size() must equal the shape's element count).
    template <class T>
    static Tensor from(std::span<const T> values, Shape shape);
    template <class T>
    static Tensor from(const std::vector<T>& values, Shape shape) {
        return from(std::span<const T>(values), std::move(shape));
    }
    // A contiguous CPU view of memory that `owner` keeps alive (a mapped file, say): no copy, the
    // storage shares ownership of `owner`. `data` must be aligned to the element size (fp8kit::Error
    // otherwise). Memory that is read-only stays so: such a tensor is for reading (and copying).
    static Tensor view_of(std::shared_ptr<const void> owner, const void* data, Shape shape, DType dtype);

    bool defined() const noexcept { return storage_ != nullptr; }
    DType dtype() const noexcept { return dtype_; }
    Device device() const noexcept { return device_; }
    const Shape& shape() const noexcept { return shape_; }
    const Shape& strides() const noexcept { return strides_; }
    int64_t dim() const noexcept { return int64_t(shape_.size()); }
    int64_t size(int64_t d) const;  // d < 0 counts from the end
    int64_t numel() const noexcept;
    size_t nbytes() const noexcept { return size_t(numel()) * dtype_size(dtype_); }
    bool is_contiguous() const noexcept;
    int64_t storage_offset() const noexcept { return offset_; }  // elements
    bool shares_storage_with(const Tensor& other) const noexcept { return storage_ == other.storage_; }

    // First element. data<T>() checks that T holds the dtype (uint8_t for u8, bool and FP8 codes) and
    // that the tensor lives in host memory.
    void* raw_data() const noexcept;
    template <class T>
    T* data() const {
        check_access(holds<T>(dtype_), sizeof(T));
        return static_cast<T*>(raw_data());
    }

    // Views (no copy).
    Tensor reshape(Shape shape) const;                            // contiguous only; one -1 allowed
    Tensor slice(int64_t d, int64_t begin, int64_t end) const;   // [begin, end) of dimension d
    Tensor transpose() const;                                     // 2-D: swaps the dimensions
    // Copies.
    Tensor contiguous() const;  // itself if already contiguous
    Tensor clone() const;

    // One element as float (FP8 codes decoded, integers and f64 converted), and set from float
    // (FP8: encoded round-to-nearest, saturating; integers and bool: must be an integer in range).
    float get(std::initializer_list<int64_t> index) const;
    void set(std::initializer_list<int64_t> index, float value) const;
    template <class T>
    T& at(std::initializer_list<int64_t> index) const {
        return data<T>()[element_offset(index)];
    }

private:
    void check_access(bool type_ok, size_t elem_size) const;
    int64_t element_offset(std::initializer_list<int64_t> index) const;  // from data(), checked

    std::shared_ptr<std::byte> storage_;
    int64_t offset_ = 0;  // elements
    Shape shape_, strides_;
    DType dtype_ = DType::f32;
    Device device_ = Device::cpu;
};

}  // namespace fp8kit
