// bench/common.hpp: what every fp8kit benchmark shares - options, best-of timing, inputs, the
// memcpy / read / FMA peak peers, the clock estimate, and output as a human table or JSON lines
// (format in DESIGN.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "fp8kit/tensor.hpp"

namespace fp8kit::bench {

struct Options {
    bool json = false;   // one JSON object per line instead of the table
    bool quick = false;  // fewer cases and repetitions: under a minute on 2 cores
};

// Best (minimum) seconds per call of fn over repeated runs lasting about `budget` seconds
// (at least 3 runs after one warm-up). The minimum is the least disturbed by other load.
// `before`, when given, runs untimed ahead of every timed call (e.g. flushing the caches).
double best_seconds(const std::function<void()>& fn, double budget, const std::function<void()>& before = {});

// best_seconds of several calls that take turns: after one warm-up call each, `rounds` rounds in
// which each call repeats for budget / rounds seconds (at least once); `after(i)`, when given,
// runs after call i's turn (a check of its result). Why turns: on a shared VM whose memory
// bandwidth moves from one minute to the next (54-88 GB/s within an hour on the Zen 5 of
// docs/PERF.md), implementations timed one after another each meet a bandwidth of their own,
// and a ratio of them measures the VM; in turns a burst reaches every one alike.
std::vector<double> best_seconds_in_turns(const std::vector<std::function<void()>>& calls, double budget, int rounds,
                                          const std::function<void()>& before = {},
                                          const std::function<void(size_t)>& after = {});

// A [rows, cols] f32 or bf16 tensor of deterministic, roughly normal values: the sum of four
// uniforms scaled to variance 1 (Irwin-Hall; |x| < 3.47, never subnormal). The same seed gives
// the same values in either dtype (bf16: rounded to nearest even).
Tensor normal_tensor(int64_t rows, int64_t cols, DType dtype, uint32_t seed);

// Allocates tensors of these byte sizes and writes one byte per 4 KiB page of each, split over
// `threads` threads: what a fresh output costs before an operation writes it (page faults, zeroing).
void alloc_and_touch(const std::vector<size_t>& sizes, int threads);

// memcpy of `bytes` split over `threads` threads in contiguous ranges, as the kernels split.
void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads);

// Reads `bytes` split over `threads` threads and returns a sum of them, so the compiler cannot drop
// it: the read-bandwidth peer of a conversion or GEMM that mostly reads. Each thread reads its
// contiguous share as `streams` (1, 2, 4 or 8) equal sub-ranges in turn, one 64-byte line of each
// per step - several hardware prefetch streams in flight, as a kernel reading several strips has -
// with the widest vector loads the CPU has (AVX-512, AVX2; fp8kit's own cpuid check), into
// independent accumulators (bench/fma_peak.cpp).
unsigned long long parallel_read(const void* src, size_t bytes, int threads, int streams = 4);

// The read peer at this machine's best: parallel_read of `bytes` timed with 1, 2, 4 and 8 streams
// per thread, the fastest reported, beside the plain loop of 64-bit sums (what the benchmarks
// reported before: a scalar-looking peer that two cores' vector loads beat by far).
struct ReadPeak {
    double gbps;        // the fastest
    int streams;        // its streams per thread
    const char* isa;    // its loads: "avx512", "avx2" or "portable"
    double plain_gbps;  // one 64-bit sum over the bytes, in order
};
ReadPeak read_peak(const void* src, size_t bytes, int threads, double budget);

// The last-level cache a core of this machine allocates into, in bytes: Linux's
// /sys/devices/system/cpu/cpu0/cache/index3/size, else 32 MiB. (Not sysconf's level-3 size: on
// a Zen 5 EPYC VM it gave the whole socket's 384 MiB, twelve 32 MiB L3s no core shares.)
size_t last_level_cache_bytes();

// Nominal clock in GHz from the CPU's time-stamp counter (0 where there is none). Elements per
// cycle are reported against this clock; turbo clocks make the true per-cycle figure lower.
double tsc_ghz();

// The float32 FMA peak of `threads` threads, from independent chains of vector FMAs: AVX-512 or
// AVX2 where the CPU has them (fp8kit's own cpuid check), else plain multiply-adds (portable).
struct FmaPeak {
    double gflops;    // 2 flops per lane of each FMA
    const char* isa;  // "avx512", "avx2" or "portable"
};
FmaPeak fma_peak(int threads, double budget);

// The bf16 dot-product peak of `threads` threads - chains of VDPBF16PS, 16 lanes x 2 products x 2
// flops each - where the CPU has AVX512-BF16 (fp8kit's GEMM kernels "avx512-bf16" or "amx"), else
// 0: the compute bound of the GEMMs that multiply bf16 pairs, fp8kit's FP8 tiles and oneDNN's bf16.
double dot_bf16_peak(int threads, double budget);

// The AMX bf16 tile peak of `threads` threads - chains of TDPBF16PS on tiles held in registers,
// 16 x 16 x 32 products x 2 flops each - where fp8kit's GEMM kernels are "amx", else 0: the
// compute bound of fp8kit's amx kernels and oneDNN's AMX bf16 matmul (bench/amx_peak.cpp).
double amx_bf16_peak(int threads, double budget);
// Runs n iterations of four tile products on the calling thread (bench/amx_peak.cpp).
float amx_chains(long long n);

// D[m, n] = A[m, k] . W[n, k]^T in float32 by OpenBLAS's cblas_sgemm on `threads` threads: the
// high-precision baseline of `fp8kit advise`. False, doing nothing, in a build without OpenBLAS.
bool openblas_sgemm(const float* a, const float* w, float* d, int64_t m, int64_t n, int64_t k, int threads);

// One result row: ordered key/value pairs, values already formatted (numbers unquoted).
class Row {
public:
    Row& add(const std::string& key, const std::string& value);  // string value
    Row& add(const std::string& key, double value, int precision = 4);
    Row& add(const std::string& key, long long value);
    const std::vector<std::pair<std::string, std::string>>& cells() const { return cells_; }
    std::string json() const;

private:
    std::vector<std::pair<std::string, std::string>> cells_;  // value with JSON quoting if string
};

// Prints rows as JSON lines, or as an aligned table (columns from the first row's keys).
void print_rows(std::ostream& os, const std::vector<Row>& rows, bool json);

int run_convert(const Options& opt, std::ostream& os);
int run_quantize(const Options& opt, std::ostream& os);
int run_gemm(const Options& opt, std::ostream& os);
int run_layers(const Options& opt, std::ostream& os);

}  // namespace fp8kit::bench
