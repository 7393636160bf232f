// bench/fma_peak.cpp: the machine's peaks the benchmarks report against - the float32 FMA peak
// (the compute bound of the GEMM's large shapes), the bf16 dot-product peak where the CPU has
// AVX512-BF16 (the bound of the GEMMs that multiply bf16 pairs) and the read bandwidth (the bound of what streams
// its input: conversions, M = 1 GEMMs). The FMA peak is checked against the CPU's nominal figure:
// lanes x FMA pipes x 2 flops x clock (an AVX-512 core with two FMA pipes at ~3 GHz: ~190
// GFLOP/s); the read peak against the plain loop it replaced and the bandwidth OpenBLAS's sgemv
// reaches in the same run (bench_gemm prints both).
//
// Each thread runs `chains` independent dependency chains acc = acc * m + c, enough to keep every
// FMA pipe busy through the instruction's latency (2 pipes x 4 cycles = 8 in flight; 16 and 12
// leave room), with m < 1 so the values stay normal. Each ISA path is compiled for its
// instructions through a target attribute on its function, so this file needs no flags and the
// rest of the benchmark stays portable; the path is chosen at run time by fp8kit's own cpuid check.
#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

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

// The sum of every lane of n chains (keeps the chains' results alive).
FP8KIT_TARGET("avx512f") float sum_chains(const __m512* acc, int n) {
    __m512 s = acc[0];
    for (int j = 1; j < n; ++j) s = _mm512_add_ps(s, acc[j]);
    alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it (-Wuninitialized)
    _mm512_store_ps(lanes, s);
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
    return sum_chains(acc, avx512_chains);
}

// bf16 pair dot products (VDPBF16PS): 16 chains, for a latency of ~6 cycles at two a cycle (Zen
// 5). Every pair is (2^-8, 2^-8), so each instruction adds 2^-15 to a lane: normal throughout
// (the instruction flushes subnormals), and 2^20 iterations sum to 32.
constexpr int dot_chains = 16;

FP8KIT_TARGET("avx512f,avx512bf16") float chains_dot_bf16(long long n) {
    const __m512 pair = _mm512_set1_ps(1.0f / 256.0f);
    const __m512bh x = _mm512_cvtne2ps_pbh(pair, pair);  // 2^-8, exact in bf16
    __m512 acc[dot_chains];
    for (int j = 0; j < dot_chains; ++j) acc[j] = _mm512_set1_ps(float(j + 1));
    for (long long i = 0; i < n; ++i) {
        for (int j = 0; j < dot_chains; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, x);
    }
    return sum_chains(acc, dot_chains);
}
#endif

volatile float sink;  // keeps the chains' results alive

// GFLOP/s of `threads` threads each running run(iterations), `flops` per iteration.
double chains_gflops(float (*run)(long long), int flops, int threads, double budget) {
    const double s = best_seconds(
        [&] {
            float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
            total += run(iterations);
            sink = total;
        },
        budget);
    return double(threads) * double(iterations) * flops / s * 1e-9;
}

// ---- reads: S streams of 64-byte lines, summed as 64-bit integers into S accumulators ----
// Lines [0, lines) of p as S equal sub-ranges read in turn; the lines past S * (lines / S) are
// read from the last sub-range's end by the caller's plain loop.
template <int S>
uint64_t lines_portable(const std::byte* p, size_t lines) {
    const size_t per = lines / S;
    uint64_t acc[S][8] = {};
    for (size_t i = 0; i < per; ++i) {
        for (int s = 0; s < S; ++s) {
            uint64_t w[8];
            std::memcpy(w, p + (s * per + i) * 64, 64);
            for (int j = 0; j < 8; ++j) acc[s][j] += w[j];
        }
    }
    uint64_t r = 0;
    for (auto& a : acc) {
        for (uint64_t v : a) r += v;
    }
    return r;
}

#if defined(FP8KIT_BENCH_X86)
template <int S>
FP8KIT_TARGET("avx2") uint64_t lines_avx2(const std::byte* p, size_t lines) {
    const size_t per = lines / S;
    __m256i acc[S];
    for (int s = 0; s < S; ++s) acc[s] = _mm256_setzero_si256();
    for (size_t i = 0; i < per; ++i) {
        for (int s = 0; s < S; ++s) {
            const auto* q = reinterpret_cast<const __m256i*>(p + (s * per + i) * 64);
            acc[s] = _mm256_add_epi64(acc[s], _mm256_add_epi64(_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)));
        }
    }
    alignas(32) uint64_t lanes[4];
    uint64_t r = 0;
    for (int s = 0; s < S; ++s) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[s]);
        for (uint64_t v : lanes) r += v;
    }
    return r;
}

template <int S>
FP8KIT_TARGET("avx512f") uint64_t lines_avx512(const std::byte* p, size_t lines) {
    const size_t per = lines / S;
    __m512i acc[S];
    for (int s = 0; s < S; ++s) acc[s] = _mm512_setzero_si512();
    for (size_t i = 0; i < per; ++i) {
        for (int s = 0; s < S; ++s) acc[s] = _mm512_add_epi64(acc[s], _mm512_loadu_si512(p + (s * per + i) * 64));
    }
    alignas(64) uint64_t lanes[8];
    uint64_t r = 0;
    for (int s = 0; s < S; ++s) {
        _mm512_store_si512(lanes, acc[s]);
        for (uint64_t v : lanes) r += v;
    }
    return r;
}
#endif

using LinesFn = uint64_t (*)(const std::byte*, size_t);

// The widest loads this CPU has, as for the FMA peak: a row of lines_by_isa.
enum class ReadIsa { portable, avx2, avx512 };
constexpr const char* read_isa_names[] = {"portable", "avx2", "avx512"};
ReadIsa read_isa() {
#if defined(FP8KIT_BENCH_X86)
    if (cpu_supports(Isa::avx512)) return ReadIsa::avx512;
    if (cpu_supports(Isa::avx2)) return ReadIsa::avx2;
#endif
    return ReadIsa::portable;
}

// [ReadIsa][log2 streams]: 1, 2, 4 and 8 streams per thread.
constexpr int stream_counts[] = {1, 2, 4, 8};
#if defined(FP8KIT_BENCH_X86)
constexpr LinesFn lines_by_isa[3][4] = {
    {&lines_portable<1>, &lines_portable<2>, &lines_portable<4>, &lines_portable<8>},
    {&lines_avx2<1>, &lines_avx2<2>, &lines_avx2<4>, &lines_avx2<8>},
    {&lines_avx512<1>, &lines_avx512<2>, &lines_avx512<4>, &lines_avx512<8>}};
#else
constexpr LinesFn lines_by_isa[1][4] = {{&lines_portable<1>, &lines_portable<2>, &lines_portable<4>, &lines_portable<8>}};
#endif

LinesFn lines_fn(int streams) {
    int i = 0;
    while (i < 3 && stream_counts[i] < streams) ++i;
    return lines_by_isa[int(read_isa())][i];
}

// A thread's share [p, p + bytes): whole lines by `fn`, the rest in plain 64-bit words and bytes.
uint64_t read_share(const std::byte* p, size_t bytes, int streams, LinesFn fn) {
    const size_t lines = bytes / 64, vector_lines = lines / size_t(streams) * size_t(streams);
    uint64_t r = fn(p, vector_lines);
    for (size_t at = vector_lines * 64; at < bytes; ++at) r += uint64_t(p[at]);
    return r;
}

uint64_t plain_read(const void* src, size_t bytes, int threads) {
    const auto* words = static_cast<const unsigned long long*>(src);
    const size_t n = bytes / 8;
    unsigned long long sum = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < n; ++i) sum += words[i];
    return sum;
}

volatile uint64_t read_sink;  // keeps the reads' sums alive

}  // namespace

unsigned long long parallel_read(const void* src, size_t bytes, int threads, int streams) {
    const auto* p = static_cast<const std::byte*>(src);
    const LinesFn fn = lines_fn(streams);
    if (threads <= 1) return read_share(p, bytes, streams, fn);  // no parallel region for small reads
    // Contiguous shares of whole lines, as the kernels split their work.
    const size_t lines = bytes / 64, per = lines / size_t(threads);
    uint64_t sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    {
        const int t = omp_get_thread_num();
        const size_t from = size_t(t) * per * 64;
        const size_t to = t == threads - 1 ? bytes : from + per * 64;
        sum += read_share(p + from, to - from, streams, fn);
    }
    return sum;
}

ReadPeak read_peak(const void* src, size_t bytes, int threads, double budget) {
    ReadPeak best{0.0, 0, read_isa_names[int(read_isa())], 0.0};
    for (int streams : stream_counts) {
        const double s = best_seconds([&] { read_sink = read_sink + parallel_read(src, bytes, threads, streams); }, budget);
        const double gbps = double(bytes) / s * 1e-9;
        if (gbps > best.gbps) best.gbps = gbps, best.streams = streams;
    }
    const double s = best_seconds([&] { read_sink = read_sink + plain_read(src, bytes, threads); }, budget);
    best.plain_gbps = double(bytes) / s * 1e-9;
    return best;
}

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
    return {chains_gflops(run, flops, threads, budget), isa};
}

double dot_bf16_peak(int threads, double budget) {
#if defined(FP8KIT_BENCH_X86)
    const std::string_view kernels = gemm_kernels_name();  // both need AVX512-BF16
    if (kernels == "avx512-bf16" || kernels == "amx") return chains_gflops(&chains_dot_bf16, dot_chains * 16 * 2 * 2, threads, budget);
#endif
    (void)threads, (void)budget;
    return 0.0;
}

double amx_bf16_peak(int threads, double budget) {
#if defined(FP8KIT_BENCH_AMX)
    constexpr int tile_product_flops = 16 * 16 * 32 * 2;
    if (gemm_kernels_name() == "amx") return chains_gflops(&amx_chains, 4 * tile_product_flops, threads, budget);
#endif
    (void)threads, (void)budget;
    return 0.0;
}

}  // namespace fp8kit::bench
