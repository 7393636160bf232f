// bench/bench_convert.cpp: bulk FP8 conversion speed, side by side with memcpy of the same bytes.
//
// For each conversion (f32->e4m3fn scaled+saturating, e4m3fn->f32, bf16->e4m3fn, e4m3fn->bf16,
// f32->e5m2, e5m2->f32), each code path this CPU has, 1 thread and all threads, in cache and out
// of cache: GB/s of bytes moved (input read + output written), the ratio to memcpy moving the same
// number of bytes in the same run, out of cache the ratio to merely reading the input (vs_read: 1.0
// means the conversion costs no more than one read pass over its input), and elements per (TSC)
// cycle per core.
//
// Working set = input + output bytes: 32 KiB in cache (each thread converts its own buffer),
// 256 MiB out of cache (one conversion split over the threads, as the library does).
// Run by `bench_convert [--json] [--quick]` and `fp8kit bench convert`. Results: docs/PERF.md.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <span>
#include <thread>
#include <vector>

#include "common.hpp"
#include "fp8kit/convert.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::bench {

namespace {

constexpr size_t in_cache_bytes = size_t(32) << 10;
constexpr size_t out_of_cache_bytes = size_t(256) << 20;

// Plain buffers of bytes, filled with values that exercise the whole format (not just zeros).
struct Buffers {
    std::vector<float> f32;
    std::vector<bf16> b16;
    std::vector<uint8_t> codes;

    explicit Buffers(size_t n) : f32(n), b16(n), codes(n) {
        uint32_t s = 12345;
        for (size_t i = 0; i < n; ++i) {
            s = s * 1664525u + 1013904223u;
            // Uniform in about [-600, 600): with scale 0.75 this covers normals, subnormals after
            // scaling small values, and saturation above 448.
            f32[i] = (float(s >> 8) * 0x1p-24f - 0.5f) * 1200.0f;
            b16[i] = bf16(f32[i]);
            codes[i] = uint8_t(s >> 24);
        }
    }
};

struct Case {
    const char* op;
    size_t in_bytes, out_bytes;  // per element
    // Converts elements [0, n) of the given buffers.
    void (*run)(Buffers& src, Buffers& dst, size_t n);
};

constexpr float scale = 0.75f;

unsigned long long read_sink = 0;  // keeps the read peer's sums alive

const Case cases[] = {
    {"f32->e4m3fn", 4, 1,
     [](Buffers& s, Buffers& d, size_t n) {
         encode(std::span<const float>(s.f32.data(), n), std::span(d.codes.data(), n), Format::e4m3fn,
                Overflow::saturate, scale);
     }},
    {"e4m3fn->f32", 1, 4,
     [](Buffers& s, Buffers& d, size_t n) {
         decode(std::span<const uint8_t>(s.codes.data(), n), std::span(d.f32.data(), n), Format::e4m3fn, 1.0f / scale);
     }},
    {"bf16->e4m3fn", 2, 1,
     [](Buffers& s, Buffers& d, size_t n) {
         encode(std::span<const bf16>(s.b16.data(), n), std::span(d.codes.data(), n), Format::e4m3fn,
                Overflow::saturate, scale);
     }},
    {"e4m3fn->bf16", 1, 2,
     [](Buffers& s, Buffers& d, size_t n) {
         decode(std::span<const uint8_t>(s.codes.data(), n), std::span(d.b16.data(), n), Format::e4m3fn, 1.0f / scale);
     }},
    {"f32->e5m2", 4, 1,
     [](Buffers& s, Buffers& d, size_t n) {
         encode(std::span<const float>(s.f32.data(), n), std::span(d.codes.data(), n), Format::e5m2,
                Overflow::saturate, scale);
     }},
    {"e5m2->f32", 1, 4,
     [](Buffers& s, Buffers& d, size_t n) {
         decode(std::span<const uint8_t>(s.codes.data(), n), std::span(d.f32.data(), n), Format::e5m2, 1.0f / scale);
     }},
};

struct Measured {
    double seconds;  // per conversion (per thread's conversion, in cache)
    size_t bytes;    // moved by one conversion (in cache: by each thread's)
};

// In cache: every thread repeatedly converts its own small buffer (fn is run `inner` times per
// timed run so a run lasts long enough to time). Out of cache: one big call over all threads.
Measured measure(bool in_cache, int threads, size_t bytes_per_elem, double budget,
                 const std::function<void(Buffers&, Buffers&, size_t)>& fn,
                 std::vector<Buffers>& src, std::vector<Buffers>& dst) {
    const size_t n = (in_cache ? in_cache_bytes : out_of_cache_bytes) / bytes_per_elem;
    if (!in_cache) {
        set_num_threads(threads);
        return {best_seconds([&] { fn(src[0], dst[0], n); }, budget), n * bytes_per_elem};
    }
    set_num_threads(1);
    const int inner = 64;
    const double s = best_seconds(
        [&] {
#pragma omp parallel num_threads(threads)
            {
                const int t = omp_get_thread_num();
                for (int r = 0; r < inner; ++r) fn(src[size_t(t)], dst[size_t(t)], n);
            }
        },
        budget);
    return {s / inner, n * bytes_per_elem};
}

}  // namespace

int run_convert(const Options& opt, std::ostream& os) {
    const int all_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    std::vector<int> thread_counts = {1};
    if (all_threads > 1) thread_counts.push_back(all_threads);
    std::vector<Isa> isas(supported_isas().begin(), supported_isas().end());
    if (opt.quick) isas = {active_isa()};
    const Isa restore_isa = active_isa();
    const int restore_threads = num_threads();
    const double budget = opt.quick ? 0.05 : 0.3;
    const double ghz = tsc_ghz();

    // One out-of-cache buffer set (shared by all threads), one small set per thread.
    std::vector<Buffers> big_src, big_dst, small_src, small_dst;
    big_src.emplace_back(out_of_cache_bytes / 2);
    big_dst.emplace_back(out_of_cache_bytes / 2);
    for (int t = 0; t < all_threads; ++t) {
        small_src.emplace_back(in_cache_bytes / 2);
        small_dst.emplace_back(in_cache_bytes / 2);
    }

    std::vector<Row> rows;
    for (const Case& c : cases) {
        const size_t bpe = c.in_bytes + c.out_bytes;
        for (bool in_cache : {true, false}) {
            auto& src = in_cache ? small_src : big_src;
            auto& dst = in_cache ? small_dst : big_dst;
            for (int threads : thread_counts) {
                // The peer: memcpy moving the same bytes (reads half, writes half), same threads
                // (in cache each thread copies its own buffer, so the copy itself is 1-threaded).
                const int copy_threads = in_cache ? 1 : threads;
                auto copy = [copy_threads](Buffers& s, Buffers& d, size_t n) {
                    parallel_memcpy(d.codes.data(), s.codes.data(), n, copy_threads);
                };
                // memcpy of n bytes moves 2n bytes: measure it as 2-byte "elements".
                const Measured mem = measure(in_cache, threads, 2, budget, copy, src, dst);
                const double mem_gbps = double(mem.bytes) * (in_cache ? threads : 1) / mem.seconds * 1e-9;
                rows.push_back(Row()
                                   .add("bench", "convert")
                                   .add("op", c.op)
                                   .add("impl", "memcpy")
                                   .add("cache", in_cache ? "in" : "out")
                                   .add("threads", (long long)threads)
                                   .add("bytes", (long long)mem.bytes)
                                   .add("seconds", mem.seconds, 5)
                                   .add("gbps", mem_gbps, 4));
                // The read peer (out of cache only, where both are bound by memory): one pass
                // reading the input bytes (a sum), same threads.
                Measured rd{0.0, 0};
                if (!in_cache) {
                    auto read = [threads, &c](Buffers& s, Buffers&, size_t n) {
                        read_sink += parallel_read(s.f32.data(), n * c.in_bytes / 8 * 8, threads);
                    };
                    rd = measure(in_cache, threads, bpe, budget, read, src, dst);
                    const double in_bytes = double(rd.bytes / bpe * c.in_bytes);
                    rows.push_back(Row()
                                       .add("bench", "convert")
                                       .add("op", c.op)
                                       .add("impl", "read")
                                       .add("cache", "out")
                                       .add("threads", (long long)threads)
                                       .add("bytes", (long long)in_bytes)
                                       .add("seconds", rd.seconds, 5)
                                       .add("gbps", in_bytes / rd.seconds * 1e-9, 4));
                }
                for (Isa isa : isas) {
                    set_isa(isa);
                    const Measured m = measure(in_cache, threads, bpe, budget, c.run, src, dst);
                    const double elems = double(m.bytes / bpe) * (in_cache ? threads : 1);
                    const double gbps = double(m.bytes) * (in_cache ? threads : 1) / m.seconds * 1e-9;
                    Row r;
                    r.add("bench", "convert")
                        .add("op", c.op)
                        .add("impl", "fp8kit." + std::string(to_string(isa)))
                        .add("cache", in_cache ? "in" : "out")
                        .add("threads", (long long)threads)
                        .add("bytes", (long long)m.bytes)
                        .add("seconds", m.seconds, 5)
                        .add("gbps", gbps, 4)
                        .add("vs_memcpy", gbps / mem_gbps, 3);
                    if (!in_cache) r.add("vs_read", rd.seconds / m.seconds, 3);
                    if (ghz > 0) r.add("elem_per_cycle_core", elems / m.seconds / (ghz * 1e9) / threads, 3);
                    rows.push_back(r);
                }
            }
        }
    }
    set_isa(restore_isa);
    set_num_threads(restore_threads);
    if (!opt.json) {
        os << "fp8kit bench convert: bytes moved = input read + output written; memcpy moves the same bytes.\n"
           << "TSC clock " << ghz << " GHz (elem_per_cycle_core is per TSC cycle).\n\n";
    }
    print_rows(os, rows, opt.json);
    return 0;
}

}  // namespace fp8kit::bench
