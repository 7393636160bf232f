// bench/fma_peak.cpp: the float32 FMA peak, the compute bound the GEMM benchmark reports its
// large shapes against. Checked against the CPU's nominal figure: lanes x FMA pipes x 2 flops x
// clock (an AVX-512 core with two FMA pipes at ~3 GHz: ~190 GFLOP/s).
//
// Each thread runs `chains` independent dependency chains acc = acc * m + c, enough to keep every
// FMA pipe busy through the instruction's latency (2 pipes x 4 cycles = 8 in flight; 16 and 12
// leave room), with m < 1 so the values stay normal. Each ISA path is compiled for its
// instructions through a target attribute on its function, so this file needs no flags and the
// rest of the benchmark stays portable; the path is chosen at run time by fp8kit's own cpuid check.
#include <omp.h>

#include "common.hpp"
#include "fp8kit/runtime.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FP8KIT_BENCH_X86 1
#if defined(__GNUC__)  // GCC and Clang: intrinsics need their ISA enabled on the function
#define FP8KIT_TARGET(isa) __attribute__((target(isa)))
#else  // MSVC compiles intrinsics of any ISA without flags
#define FP8KIT_TARGET(isa)
#endif
#endif

namespace fp8kit::bench {

namespace {

constexpr long long iterations = 1 << 20;  // per call and thread: ~10 ms at 3 GHz
constexpr float mul = 0.999999f, add = 1e-6f;

// Portable: separate multiply and add (the compiler may vectorise over the chains); 2 flops each.
float chains_portable(long long n) {
    constexpr int chains = 32;
    float acc[chains];
    for (int j = 0; j < chains; ++j) acc[j] = float(j + 1);
    for (long long i = 0; i < n; ++i) {
        for (int j = 0; j < chains; ++j) acc[j] = acc[j] * mul + add;
    }
    float s = 0.0f;
    for (float a : acc) s += a;
    return s;
}
constexpr int portable_flops_per_iteration = 32 * 2;

#if defined(FP8KIT_BENCH_X86)
// AVX2 has 16 registers: 12 chains + 2 constants fit; AVX-512 has 32.
constexpr int avx2_chains = 12, avx512_chains = 16;

FP8KIT_TARGET("avx2,fma") float chains_avx2(long long n) {
    const __m256 m = _mm256_set1_ps(mul), c = _mm256_set1_ps(add);
    __m256 acc[avx2_chains];
    for (int j = 0; j < avx2_chains; ++j) acc[j] = _mm256_set1_ps(float(j + 1));
    for (long long i = 0; i < n; ++i) {
        for (int j = 0; j < avx2_chains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, c);
    }
    __m256 s = acc[0];
    for (int j = 1; j < avx2_chains; ++j) s = _mm256_add_ps(s, acc[j]);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, s);
    float r = 0.0f;
    for (float v : lanes) r += v;
    return r;
}

FP8KIT_TARGET("avx512f") float chains_avx512(long long n) {
    const __m512 m = _mm512_set1_ps(mul), c = _mm512_set1_ps(add);
    __m512 acc[avx512_chains];
    for (int j = 0; j < avx512_chains; ++j) acc[j] = _mm512_set1_ps(float(j + 1));
    for (long long i = 0; i < n; ++i) {
        for (int j = 0; j < avx512_chains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, c);
    }
    __m512 s = acc[0];
    for (int j = 1; j < avx512_chains; ++j) s = _mm512_add_ps(s, acc[j]);
    alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it (-Wuninitialized)
    _mm512_store_ps(lanes, s);
    float r = 0.0f;
    for (float v : lanes) r += v;
    return r;
}
#endif

volatile float sink;  // keeps the chains' results alive

}  // namespace

FmaPeak fma_peak(int threads, double budget) {
    float (*run)(long long) = &chains_portable;
    int flops = portable_flops_per_iteration;
    const char* isa = "portable";
#if defined(FP8KIT_BENCH_X86)
    if (cpu_supports(Isa::avx512)) {
        run = &chains_avx512, flops = avx512_chains * 16 * 2, isa = "avx512";
    } else if (cpu_supports(Isa::avx2)) {  // fp8kit's avx2 includes FMA
        run = &chains_avx2, flops = avx2_chains * 8 * 2, isa = "avx2";
    }
#endif
    const double s = best_seconds(
        [&] {
            float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
            total += run(iterations);
            sink = total;
        },
        budget);
    return {double(threads) * double(iterations) * flops / s * 1e-9, isa};
}

}  // namespace fp8kit::bench
