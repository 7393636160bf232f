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

// The C++ type that holds one element: float, bf16, f16, double, the fixed-width integers, and
// uint8_t for u8, boolean and every FP8 dtype (codes).
template <class T> inline constexpr bool is_element_type_v = false;
template <> inline constexpr bool is_element_type_v<float> = true;
template <> inline constexpr bool is_element_type_v<bf16> = true;
template <> inline constexpr bool is_element_type_v<f16> = true;
template <> inline constexpr bool is_element_type_v<uint8_t> = true;
template <> inline constexpr bool is_element_type_v<int32_t> = true;
template <> inline constexpr bool is_element_type_v<double> = true;
template <> inline constexpr bool is_element_type_v<int8_t> = true;
template <> inline constexpr bool is_element_type_v<int16_t> = true;
template <> inline constexpr bool is_element_type_v<int64_t> = true;
template <> inline constexpr bool is_element_type_v<uint16_t> = true;
template <> inline constexpr bool is_element_type_v<uint32_t> = true;
template <> inline constexpr bool is_element_type_v<uint64_t> = true;

template <class T>
constexpr bool holds(DType d) noexcept {
    if constexpr (std::is_same_v<T, float>) return d == DType::f32;
    if constexpr (std::is_same_v<T, bf16>) return d == DType::bf16;
    if constexpr (std::is_same_v<T, f16>) return d == DType::f16;
    if constexpr (std::is_same_v<T, int32_t>) return d == DType::i32;
    if constexpr (std::is_same_v<T, double>) return d == DType::f64;
    if constexpr (std::is_same_v<T, int8_t>) return d == DType::i8;
    if constexpr (std::is_same_v<T, int16_t>) return d == DType::i16;
    if constexpr (std::is_same_v<T, int64_t>) return d == DType::i64;
    if constexpr (std::is_same_v<T, uint16_t>) return d == DType::u16;
    if constexpr (std::is_same_v<T, uint32_t>) return d == DType::u32;
    if constexpr (std::is_same_v<T, uint64_t>) return d == DType::u64;
    if constexpr (std::is_same_v<T, uint8_t>) return d == DType::u8 || d == DType::boolean || is_fp8(d);
    return false;
}

}  // namespace fp8kit
