// fp8kit/dtype.hpp: element types of a Tensor - the FP8 formats plus the high-precision and
// integer types around them. The first five values equal the Format values, so an FP8 dtype and
// its Format convert by a cast. Values after i32 were appended for checkpoints (safetensors' dtypes);
// the order is part of the ABI: new values go at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"

namespace fp8kit {

enum class DType : uint8_t {
    e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu,  // = Format
    f32, bf16, f16, u8, i32,
    f64, i8, i16, i64, u16, u32, u64, boolean,  // boolean: one byte, 0 or 1 ("bool")
};

constexpr bool is_fp8(DType d) noexcept { return uint8_t(d) <= uint8_t(DType::e8m0fnu); }
constexpr DType dtype_of(Format f) noexcept { return DType(uint8_t(f)); }
Format format_of(DType d);  // fp8kit::Error unless is_fp8(d)

constexpr size_t dtype_size(DType d) noexcept {
    switch (d) {
        case DType::f64: case DType::i64: case DType::u64: return 8;
        case DType::f32: case DType::i32: case DType::u32: return 4;
        case DType::bf16: case DType::f16: case DType::i16: case DType::u16: return 2;
        default: return 1;
    }
}

// "f32", "bf16", "f16", "u8", "i32", "f64", "i8", "i16", "i64", "u16", "u32", "u64", "bool" and the
// format names of <fp8kit/format.hpp>.
std::string_view to_string(DType d) noexcept;
std::optional<DType> try_parse_dtype(std::string_view name) noexcept;
DType parse_dtype(std::string_view name);  // fp8kit::Error naming the value

// The one type-to-dtype table: element_dtype<T> is the dtype a C++ element type T stands for
// (float, bf16, f16, double, the fixed-width integers; uint8_t stands for u8). Every other
// mapping (holds, Tensor::from, data<T>) is derived from it.
template <class T> struct element_dtype;  // undefined: T is not an element type
template <> struct element_dtype<float> { static constexpr DType value = DType::f32; };
template <> struct element_dtype<bf16> { static constexpr DType value = DType::bf16; };
template <> struct element_dtype<f16> { static constexpr DType value = DType::f16; };
template <> struct element_dtype<double> { static constexpr DType value = DType::f64; };
template <> struct element_dtype<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct element_dtype<int8_t> { static constexpr DType value = DType::i8; };
template <> struct element_dtype<int16_t> { static constexpr DType value = DType::i16; };
template <> struct element_dtype<int32_t> { static constexpr DType value = DType::i32; };
template <> struct element_dtype<int64_t> { static constexpr DType value = DType::i64; };
template <> struct element_dtype<uint16_t> { static constexpr DType value = DType::u16; };
template <> struct element_dtype<uint32_t> { static constexpr DType value = DType::u32; };
template <> struct element_dtype<uint64_t> { static constexpr DType value = DType::u64; };
template <class T> inline constexpr DType element_dtype_v = element_dtype<std::remove_cv_t<T>>::value;

// Whether T (const or not) can hold the elements of dtype d: its own dtype, and uint8_t also for
// bool and every FP8 dtype (their elements are codes).
template <class T>
constexpr bool holds(DType d) noexcept {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, uint8_t>) return d == DType::u8 || d == DType::boolean || is_fp8(d);
    return d == element_dtype_v<U>;
}

}  // namespace fp8kit
