// src/cpu/convert.cpp: the bulk conversion API - argument checks, the portable kernels, choice of
// SIMD path, and the split over threads.
//
// The portable kernels are the scalar encode()/decode() in a loop: the ground truth every SIMD
// path is tested against (tests/unit/test_convert*.cpp, tests/golden). Elementwise work split into
// contiguous per-thread ranges gives the same bytes for any thread count.
#include <omp.h>

#include <algorithm>
#include <string>

#include "cpu/convert_kernels.hpp"
#include "fp8kit/convert.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit {

namespace cpu {
namespace {

struct Portable {
    template <class In, Format F, Overflow O>
    static void encode(const In* in, uint8_t* out, size_t n, float scale) {
        for (size_t i = 0; i < n; ++i) out[i] = fp8kit::encode(float(in[i]) * scale, F, O);
    }
    template <class Out, Format F>
    static void decode(const uint8_t* in, Out* out, size_t n, float scale_inv) {
        for (size_t i = 0; i < n; ++i) out[i] = Out(fp8kit::decode(in[i], F) * scale_inv);
    }
};

constexpr ConvertKernels portable_table = make_convert_kernels<Portable>();

const ConvertKernels& kernels_for(Isa isa) {
    const ConvertKernels* k = nullptr;
    if (isa == Isa::avx512) k = convert_kernels_avx512();
    if (isa == Isa::avx2) k = convert_kernels_avx2();
    return k != nullptr ? *k : portable_table;
}

// Below this many elements one thread is faster than waking the team.
constexpr size_t parallel_threshold = size_t(1) << 16;

// Runs kernel(begin, count) over [0, n) in one contiguous range per thread (64-element aligned).
template <class Fn>
void parallel_ranges(size_t n, Fn&& kernel) {
    const int threads = num_threads();
    if (threads <= 1 || n < parallel_threshold) {
        kernel(size_t(0), n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const size_t team = size_t(omp_get_num_threads());
        const size_t per = ((n + team - 1) / team + 63) / 64 * 64;
        const size_t begin = std::min(n, per * size_t(omp_get_thread_num()));
        const size_t end = std::min(n, begin + per);
        if (begin < end) kernel(begin, end - begin);
    }
}

void check_sizes(const char* fn, size_t in, size_t out) {
    if (in != out) {
        throw Error(std::string("fp8kit::") + fn + ": out.size() is " + std::to_string(out) +
                    ", expected in.size() = " + std::to_string(in));
    }
}

// The table of the path in force (FP8KIT_ISA / set_isa / the best the CPU has).
const ConvertKernels& active_kernels() { return kernels_for(active_isa()); }

// Checks the spans and runs one kernel (encode or decode: same shape) over the threads.
template <class In, class Out>
void run_kernel(const char* fn, std::span<const In> in, std::span<Out> out,
                void (*kernel)(const In*, Out*, size_t, float), float scale) {
    check_sizes(fn, in.size(), out.size());
    parallel_ranges(in.size(), [&](size_t i, size_t count) { kernel(in.data() + i, out.data() + i, count, scale); });
}

}  // namespace

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
