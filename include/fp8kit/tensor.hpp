// fp8kit/tensor.hpp: a dense tensor - dtype, shape, strides, device, and storage that views share:
// fp8kit's own (64-byte aligned, freed with the last tensor that uses it) or external memory
// (a mapped file, a numpy array, a DLPack or PyTorch tensor) kept alive by its owner.
//
// Strides are in elements. Tensors made by empty()/zeros()/from() are contiguous (row-major);
// reshape(), slice() and transpose() return views of the same storage without copying, and
// contiguous() / clone() copy. Element access (get/set, at) is for tests and small programs,
// not for inner loops: use data<T>() there.
//
// Tensors on Device::cuda live in device memory (the CUDA backend's, stream-ordered on the current
// ExecContext's stream): views, to() and clone() work; element access and data<T>() are host only.
//
// Read-only storage (a read-only file mapping, a read-only numpy array): data<const T>() and every
// operation that only reads work; data<T>() with a non-const T, set() and at() throw fp8kit::Error
// naming the tensor - writing through such a view would crash the process.
// Checked by tests/unit/test_tensor.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
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
    // needs the CUDA backend (fp8kit::Error without it). CPU blocks of 2 MiB and more are kept
    // when freed (256 MiB at most, the latest) and reused for the next tensor of their size, so a
    // layer's output allocated every call does not fault its pages in every call.
    static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu);
    static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu);
    // A contiguous CPU tensor with every element `value` (as set() converts it), e.g. a delayed
    // scale: Tensor::full({1}, 2.5f).
    static Tensor full(Shape shape, float value, DType dtype = DType::f32);
    // A contiguous CPU copy of `values` (values.size() must equal the shape's element count).
    template <class T>
    static Tensor from(std::span<const T> values, Shape shape);
    template <class T>
    static Tensor from(const std::vector<T>& values, Shape shape) {
        return from(std::span<const T>(values), std::move(shape));
    }
    // A contiguous, read-only CPU view of memory that `owner` keeps alive (a mapped file, say): no
    // copy, the storage shares ownership of `owner`. `data` must be aligned to the element size
    // (fp8kit::Error otherwise). `name` (a checkpoint's tensor name, say) is what errors call it.
    static Tensor view_of(std::shared_ptr<const void> owner, const void* data, Shape shape, DType dtype,
                          std::string name = {});
    // A view of external memory with any non-negative strides (elements), what numpy, DLPack and
    // PyTorch hand over: no copy. `owner` is held while any tensor uses the memory; its deleter
    // (the DLPack deleter, a reference to the array) runs after the last one. Empty strides:
    // row-major. fp8kit::Error for a negative stride, misaligned data or a shape/stride mismatch.
    struct External {
        void* data = nullptr;
        Shape shape, strides;
        DType dtype = DType::f32;
        Device device = Device::cpu;
        bool read_only = false;
        std::string name;  // for error messages
    };
    static Tensor from_external(std::shared_ptr<const void> owner, External memory);

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
    bool read_only() const noexcept { return read_only_; }
    const std::string& name() const noexcept;  // "" unless given by view_of / from_external

    // First element. data<T>() checks that T holds the dtype (uint8_t for u8, bool and FP8 codes),
    // that the tensor lives in host memory, and - for a non-const T - that it is writable.
    // raw_data() is the writable address (fp8kit::Error if read-only), const_raw_data() any.
    void* raw_data() const;
    const void* const_raw_data() const noexcept;
    template <class T>
    T* data() const {
        check_access(holds<T>(dtype_), sizeof(T), !std::is_const_v<T>);
        return static_cast<T*>(const_cast<void*>(const_raw_data()));
    }

    // Views (no copy).
    Tensor reshape(Shape shape) const;                            // contiguous only; one -1 allowed
    Tensor slice(int64_t d, int64_t begin, int64_t end) const;   // [begin, end) of dimension d
    Tensor transpose() const;                                     // 2-D: swaps the dimensions
    // Copies. On device cuda, clone() copies contiguous tensors, and views of at most 2 dimensions
    // whose last stride is 1 (fp8kit::Error otherwise: make it contiguous on the host first).
    Tensor contiguous() const;  // itself if already contiguous
    Tensor clone() const;
    // Every element zero, in place (a contiguous, writable tensor; on cuda ordered on the stream).
    void fill_zero() const;
    // A contiguous copy on `device` (itself when it is already there and contiguous): moves
    // inputs to a GPU and results back. Waits for the copy: the data is there on return.
    Tensor to(Device device) const;

    // One element as float (FP8 codes decoded, integers and f64 converted), and set from float
    // (FP8: encoded round-to-nearest, saturating; integers and bool: must be an integer in range).
    float get(std::initializer_list<int64_t> index) const;
    void set(std::initializer_list<int64_t> index, float value) const;
    template <class T>
    T& at(std::initializer_list<int64_t> index) const {
        return data<T>()[element_offset(index)];
    }

private:
    void check_access(bool type_ok, size_t elem_size, bool write) const;
    void check_writable(const char* fn) const;
    void copy_from_device(const Tensor& src) const;
    int64_t element_offset(std::initializer_list<int64_t> index) const;  // from data(), checked

    std::shared_ptr<std::byte> storage_;
    int64_t offset_ = 0;  // elements
    Shape shape_, strides_;
    DType dtype_ = DType::f32;
    Device device_ = Device::cpu;
    bool read_only_ = false;
    std::shared_ptr<const std::string> name_;  // external memory only
};

}  // namespace fp8kit
