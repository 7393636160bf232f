// src/cpu/convert_kernels.hpp: the table of bulk conversion kernels one code path provides
// (portable, AVX2, AVX-512), and the builder that fills it from a kernel family.
//
// Kernels take raw pointers and a count; threading and argument checks live in convert.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::cpu {

inline constexpr int num_formats = 5;

template <class In>
using EncodeKernel = void (*)(const In* in, uint8_t* out, size_t n, float scale);
template <class Out>
using DecodeKernel = void (*)(const uint8_t* in, Out* out, size_t n, float scale_inv);

struct ConvertKernels {
    // [format][overflow]
    EncodeKernel<float> encode_f32[num_formats][2];
    EncodeKernel<bf16> encode_bf16[num_formats][2];
    EncodeKernel<f16> encode_f16[num_formats][2];
    // [format]
    DecodeKernel<float> decode_f32[num_formats];
    DecodeKernel<bf16> decode_bf16[num_formats];
    DecodeKernel<f16> decode_f16[num_formats];
};

// K provides `template <class In, Format F, Overflow O> static void encode(...)` and
// `template <class Out, Format F> static void decode(...)`.
template <class K>
constexpr ConvertKernels make_convert_kernels() {
    ConvertKernels t{};
    auto fill = [&t]<size_t I>(std::integral_constant<size_t, I>) {
        constexpr Format F = Format(I);
        constexpr Overflow S = Overflow::saturate, N = Overflow::nonsaturating;
        t.encode_f32[I][0] = &K::template encode<float, F, S>;
        t.encode_f32[I][1] = &K::template encode<float, F, N>;
        t.encode_bf16[I][0] = &K::template encode<bf16, F, S>;
        t.encode_bf16[I][1] = &K::template encode<bf16, F, N>;
        t.encode_f16[I][0] = &K::template encode<f16, F, S>;
        t.encode_f16[I][1] = &K::template encode<f16, F, N>;
        t.decode_f32[I] = &K::template decode<float, F>;
        t.decode_bf16[I] = &K::template decode<bf16, F>;
        t.decode_f16[I] = &K::template decode<f16, F>;
    };
    [&]<size_t... I>(std::index_sequence<I...>) {
        (fill(std::integral_constant<size_t, I>{}), ...);
    }(std::make_index_sequence<num_formats>{});
    return t;
}

// The SIMD paths' tables; they exist only in x86-64 builds (nullptr otherwise). The portable
// table lives in convert.cpp.
const ConvertKernels* convert_kernels_avx2();
const ConvertKernels* convert_kernels_avx512();

}  // namespace fp8kit::cpu
