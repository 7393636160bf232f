// src/cpu/convert_kernels.hpp: the table of bulk conversion kernels one code path provides
// (portable, AVX2, AVX-512), and the builder that fills it from a kernel family.
//
// Kernels take raw pointers and a count; threading and argument checks live in convert.cpp and
// quantize.cpp. Every kernel works on a run of n elements split into scaling groups: element k
// belongs to group (offset + k) / group (group 1: one group per element), and group arrays
// (scales, amax) are indexed from the group of element 0. amax values are float32 bits of |x|,
// whose integer order is the order of the values with every NaN above Inf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "fp8kit/format.hpp"
#include "fp8kit/half.hpp"
#include "fp8kit/runtime.hpp"
#include "fp8kit/scaling.hpp"

namespace fp8kit::cpu {

inline constexpr int num_formats = 5;

// out[k] = encode(float32(in[k] * scales[g(k)])); with amax != nullptr, *amax = max(*amax, |in| bits).
template <class In>
using EncodeKernel = void (*)(const In* in, uint8_t* out, size_t n, size_t group, size_t offset,
                              const float* scales, uint32_t* amax);
// out[k] = Out(decode(in[k]) * scale_inv[g(k)]).
template <class Out>
using DecodeKernel = void (*)(const uint8_t* in, Out* out, size_t n, size_t group, size_t offset,
                              const float* scale_inv);
// cast_transpose works in tiles of cast_tile_rows x cast_tile_cols (quantize.cpp's cast_tiles):
// wide, so that each input row is read in long runs (1 KiB of float32), and 64 rows tall, so that
// each row of the transposed copy is written in whole 64-byte lines; a tile's staged codes fit in L1.
inline constexpr size_t cast_tile_rows = 64, cast_tile_cols = 256;
// A cast_transpose whose copies are this many bytes or more each writes them with non-temporal
// stores (whole lines); smaller ones stay in the cache for the GEMM that reads them next. f32
// inputs, tensor scaling, 2 threads (Zen 5, 32 MiB L3), ms streamed / not: 2048 x 2048 0.49 / 0.40,
// 2048 x 4096 1.27 / 1.47, 4096 x 4096 2.91 / 3.66.
inline constexpr size_t cast_stream_bytes = size_t(8) << 20;
// A tile of codes (rows <= cast_tile_rows, row stride `stride`) copied to out and transposed into
// out_t, either null.
using StoreCodesKernel = void (*)(const uint8_t* stage, size_t stride, size_t rows, size_t cols, uint8_t* out,
                                  size_t ld_out, uint8_t* out_t, size_t ld_t, bool stream);
// acc[g] = max(acc[g], max |in| bits over the elements of group g).
template <class In>
using AmaxKernel = void (*)(const In* in, size_t n, size_t group, size_t offset, uint32_t* acc);
// The e8m0 scales of n MX groups from their amax bits: codes[k] = mx_scale_code and mult[k] =
// mx_quantize_multiplier of it (fp8kit/scaling.hpp), for codes of format f.
using MxScalesKernel = void (*)(const uint32_t* amax, size_t n, Format f, MxRounding r, uint8_t* codes, float* mult);

struct ConvertKernels {
    // [format][overflow]
    EncodeKernel<float> encode_f32[num_formats][2];
    EncodeKernel<bf16> encode_bf16[num_formats][2];
    EncodeKernel<f16> encode_f16[num_formats][2];
    // [format]
    DecodeKernel<float> decode_f32[num_formats];
    DecodeKernel<bf16> decode_bf16[num_formats];
    DecodeKernel<f16> decode_f16[num_formats];
    StoreCodesKernel store_codes;
    AmaxKernel<float> amax_f32;
    AmaxKernel<bf16> amax_bf16;
    AmaxKernel<f16> amax_f16;
    MxScalesKernel mx_scales;

    // The entry for an element type (float, bf16, f16).
    template <class T> EncodeKernel<T> encode(Format f, Overflow o) const;
    template <class T> DecodeKernel<T> decode(Format f) const;
    template <class T> AmaxKernel<T> amax() const;
};

template <> inline EncodeKernel<float> ConvertKernels::encode<float>(Format f, Overflow o) const { return encode_f32[int(f)][int(o)]; }
template <> inline EncodeKernel<bf16> ConvertKernels::encode<bf16>(Format f, Overflow o) const { return encode_bf16[int(f)][int(o)]; }
template <> inline EncodeKernel<f16> ConvertKernels::encode<f16>(Format f, Overflow o) const { return encode_f16[int(f)][int(o)]; }
template <> inline DecodeKernel<float> ConvertKernels::decode<float>(Format f) const { return decode_f32[int(f)]; }
template <> inline DecodeKernel<bf16> ConvertKernels::decode<bf16>(Format f) const { return decode_bf16[int(f)]; }
template <> inline DecodeKernel<f16> ConvertKernels::decode<f16>(Format f) const { return decode_f16[int(f)]; }
template <> inline AmaxKernel<float> ConvertKernels::amax<float>() const { return amax_f32; }
template <> inline AmaxKernel<bf16> ConvertKernels::amax<bf16>() const { return amax_bf16; }
template <> inline AmaxKernel<f16> ConvertKernels::amax<f16>() const { return amax_f16; }

// K provides `template <class In, Format F, Overflow O> static void encode(...)`, `static void
// store_codes(...)`, `template <class Out, Format F> static void decode(...)` and
// `template <class In> static void amax(...)` and `static void mx_scales(...)`.
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
    t.store_codes = &K::store_codes;
    t.amax_f32 = &K::template amax<float>;
    t.amax_bf16 = &K::template amax<bf16>;
    t.amax_f16 = &K::template amax<f16>;
    t.mx_scales = &K::mx_scales;
    return t;
}

// The SIMD paths' tables; they exist only in x86-64 builds (nullptr otherwise). The portable
// table lives in convert.cpp.
const ConvertKernels* convert_kernels_avx2();
const ConvertKernels* convert_kernels_avx512();

// The table of the path in force (FP8KIT_ISA / set_isa / the best the CPU has).
const ConvertKernels& active_kernels();

// Below this many elements one thread is faster than waking the team.
inline constexpr size_t parallel_threshold = size_t(1) << 16;

}  // namespace fp8kit::cpu
