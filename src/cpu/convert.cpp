// src/cpu/convert.cpp: the bulk conversion API - argument checks, the portable kernels, choice of
// SIMD path, and the split over threads.
//
// The portable kernels are the scalar encode()/decode() in a loop: the ground truth every SIMD
// path is tested against (tests/unit/test_convert*.cpp, tests/golden). Elementwise work split into
// contiguous per-thread ranges gives the same bytes for any thread count.
#include <algorithm>
#include <string>

#include "cpu/convert_kernels.hpp"
#include "cpu/parallel.hpp"
#include "fp8kit/convert.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit {

namespace cpu {
namespace {

// Calls fn(k, g) for every element k of a run and its group g (see convert_kernels.hpp).
template <class Fn>
void for_each_element(size_t n, size_t group, size_t offset, Fn&& fn) {
    for (size_t k = 0, g = 0, left = group - offset % group; k < n; ++k) {
        fn(k, g);
        if (--left == 0) {
            ++g;
            left = group;
        }
    }
}

uint32_t abs_bits(float x) { return detail::f32_bits(x) & 0x7fffffffu; }

struct Portable {
    template <class In, Format F, Overflow O>
    static void encode(const In* in, uint8_t* out, size_t n, size_t group, size_t offset, const float* scales,
                       uint32_t* amax) {
        uint32_t m = 0;
        for_each_element(n, group, offset, [&](size_t k, size_t g) {
            const float x = float(in[k]);
            m = std::max(m, abs_bits(x));
            out[k] = fp8kit::encode(x * scales[g], F, O);
        });
        if (amax != nullptr) *amax = std::max(*amax, m);
    }
    template <class Out, Format F>
    static void decode(const uint8_t* in, Out* out, size_t n, size_t group, size_t offset, const float* scale_inv) {
        for_each_element(n, group, offset, [&](size_t k, size_t g) { out[k] = Out(fp8kit::decode(in[k], F) * scale_inv[g]); });
    }
    static void store_codes(const uint8_t* stage, size_t stride, size_t rows, size_t cols, uint8_t* out, size_t ld_out,
                            uint8_t* out_t, size_t ld_t, bool /*stream*/) {
        for (size_t i = 0; i < rows; ++i) {
            for (size_t j = 0; j < cols; ++j) {
                if (out != nullptr) out[i * ld_out + j] = stage[i * stride + j];
                if (out_t != nullptr) out_t[j * ld_t + i] = stage[i * stride + j];
            }
        }
    }
    template <class In>
    static void amax(const In* in, size_t n, size_t group, size_t offset, uint32_t* acc) {
        for_each_element(n, group, offset, [&](size_t k, size_t g) { acc[g] = std::max(acc[g], abs_bits(float(in[k]))); });
    }
    static void mx_scales(const uint32_t* amax, size_t n, Format f, MxRounding r, uint8_t* codes, float* mult) {
        for (size_t k = 0; k < n; ++k) {
            codes[k] = mx_scale_code(detail::f32_from_bits(amax[k]), f, r);
            mult[k] = mx_quantize_multiplier(codes[k]);
        }
    }
};

constexpr ConvertKernels portable_table = make_convert_kernels<Portable>();

const ConvertKernels& kernels_for(Isa isa) {
    const ConvertKernels* k = nullptr;
    if (isa == Isa::avx512) k = convert_kernels_avx512();
    if (isa == Isa::avx2) k = convert_kernels_avx2();
    return k != nullptr ? *k : portable_table;
}

void check_sizes(const char* fn, size_t in, size_t out) {
    if (in != out) {
        throw Error(std::string("fp8kit::") + fn + ": out.size() is " + std::to_string(out) +
                    ", expected in.size() = " + std::to_string(in));
    }
}

// Checks the spans and runs one encode or decode kernel over the threads, each range one group.
template <class In, class Out, class... Rest>
void run_kernel(const char* fn, std::span<const In> in, std::span<Out> out,
                void (*kernel)(const In*, Out*, size_t, size_t, size_t, const float*, Rest...), float scale) {
    check_sizes(fn, in.size(), out.size());
    parallel_ranges(in.size(), [&](size_t i, size_t count) {
        kernel(in.data() + i, out.data() + i, count, count, 0, &scale, Rest{}...);
    });
}

}  // namespace

const ConvertKernels& active_kernels() { return kernels_for(active_isa()); }

#if !defined(FP8KIT_X86_KERNELS)
const ConvertKernels* convert_kernels_avx2() { return nullptr; }
const ConvertKernels* convert_kernels_avx512() { return nullptr; }
#endif

}  // namespace cpu

void encode(std::span<const float> in, std::span<uint8_t> out, Format f, Overflow o, float scale) {
    cpu::run_kernel("encode", in, out, cpu::active_kernels().encode_f32[int(f)][int(o)], scale);
}
void encode(std::span<const bf16> in, std::span<uint8_t> out, Format f, Overflow o, float scale) {
    cpu::run_kernel("encode", in, out, cpu::active_kernels().encode_bf16[int(f)][int(o)], scale);
}
void encode(std::span<const f16> in, std::span<uint8_t> out, Format f, Overflow o, float scale) {
    cpu::run_kernel("encode", in, out, cpu::active_kernels().encode_f16[int(f)][int(o)], scale);
}

void decode(std::span<const uint8_t> in, std::span<float> out, Format f, float scale_inv) {
    cpu::run_kernel("decode", in, out, cpu::active_kernels().decode_f32[int(f)], scale_inv);
}
void decode(std::span<const uint8_t> in, std::span<bf16> out, Format f, float scale_inv) {
    cpu::run_kernel("decode", in, out, cpu::active_kernels().decode_bf16[int(f)], scale_inv);
}
void decode(std::span<const uint8_t> in, std::span<f16> out, Format f, float scale_inv) {
    cpu::run_kernel("decode", in, out, cpu::active_kernels().decode_f16[int(f)], scale_inv);
}

void encode_stochastic(std::span<const float> in, std::span<uint8_t> out, Format f,
                       StochasticRounding sr, Overflow o, float scale) {
    cpu::check_sizes("encode_stochastic", in.size(), out.size());
    if (f == Format::e8m0fnu) {
        throw Error("fp8kit::encode_stochastic: format is e8m0fnu, expected a format with a mantissa "
                    "(e4m3fn, e5m2, e4m3fnuz, e5m2fnuz)");
    }
    cpu::parallel_ranges(in.size(), [&](size_t begin, size_t count) {
        for (size_t i = begin; i < begin + count; ++i) {
            out[i] = fp8kit::encode_stochastic(in[i] * scale, f, random_bits(sr.seed, sr.offset + i), o);
        }
    });
}

}  // namespace fp8kit
