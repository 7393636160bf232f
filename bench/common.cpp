// bench/common.cpp: timing, inputs, the memcpy peer, the cache size, the clock estimate and output
// for the benchmarks (the FMA and read peaks are in fma_peak.cpp, with their per-ISA code).
#include "common.hpp"

#if defined(FP8KIT_BENCH_OPENBLAS)
#include <cblas.h>
#endif

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#if defined(_MSC_VER)
#include <intrin.h>
#else
#include <x86intrin.h>
#endif
#define FP8KIT_HAVE_TSC 1
#endif

namespace fp8kit::bench {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

double best_seconds(const std::function<void()>& fn, double budget, const std::function<void()>& before) {
    return best_seconds_in_turns({fn}, budget, 3, before)[0];
}

std::vector<double> best_seconds_in_turns(const std::vector<std::function<void()>>& calls, double budget, int rounds,
                                          const std::function<void()>& before,
                                          const std::function<void(size_t)>& after) {
    for (const auto& fn : calls) fn();  // warm-up: page faults, caches, thread team
    std::vector<double> best(calls.size(), 1e300);
    for (int round = 0; round < rounds; ++round) {
        for (size_t i = 0; i < calls.size(); ++i) {
            const auto start = Clock::now();
            for (int runs = 0; runs < 1 || (since(start) < budget / rounds && runs < 10000); ++runs) {
                if (before) before();
                const auto t0 = Clock::now();
                calls[i]();
                best[i] = std::min(best[i], since(t0));
            }
            if (after) after(i);
        }
    }
    return best;
}

Tensor normal_tensor(int64_t rows, int64_t cols, DType dtype, uint32_t seed) {
    Tensor t = Tensor::empty({rows, cols}, dtype);
    const size_t n = size_t(rows * cols);
    uint32_t s = seed;
    auto uniform = [&s] {
        s = s * 1664525u + 1013904223u;
        return float(s >> 8) * 0x1p-24f;
    };
    float* f = dtype == DType::f32 ? t.data<float>() : nullptr;
    bf16* b = dtype == DType::bf16 ? t.data<bf16>() : nullptr;
    for (size_t i = 0; i < n; ++i) {
        const float v = (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f;
        if (f != nullptr) {
            f[i] = v;
        } else {
            b[i] = bf16(v);
        }
    }
    return t;
}

void alloc_and_touch(const std::vector<size_t>& sizes, int threads) {
    for (size_t bytes : sizes) {
        Tensor t = Tensor::empty({int64_t(bytes)}, DType::u8);
        auto* p = t.data<uint8_t>();
        const int64_t pages = int64_t((bytes + 4095) / 4096);
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t k = 0; k < pages; ++k) p[k * 4096] = 1;
    }
}

void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads) {
    if (threads <= 1) {  // no parallel region: its overhead would dominate small copies
        std::memcpy(dst, src, bytes);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const size_t team = size_t(omp_get_num_threads());
        const size_t per = ((bytes + team - 1) / team + 63) / 64 * 64;
        const size_t begin = std::min(bytes, per * size_t(omp_get_thread_num()));
        const size_t end = std::min(bytes, begin + per);
        if (begin < end) std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
    }
}

size_t last_level_cache_bytes() {
    // A plain file read (no OS API: those live in src/platform/), absent off Linux.
    if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
        unsigned long long size = 0;
        char unit = 0;
        const int got = std::fscanf(f, "%llu%c", &size, &unit);
        std::fclose(f);
        if (got >= 1 && size > 0) return size_t(size) << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
    }
    return size_t(32) << 20;
}

double tsc_ghz() {
#if defined(FP8KIT_HAVE_TSC)
    static const double ghz = [] {
        const auto t0 = Clock::now();
        const unsigned long long c0 = __rdtsc();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const unsigned long long c1 = __rdtsc();
        return double(c1 - c0) / since(t0) * 1e-9;
    }();
    return ghz;
#else
    return 0.0;
#endif
}

Row& Row::add(const std::string& key, const std::string& value) {
    std::string quoted = "\"";
    for (char c : value) {
        if (c == '"' || c == '\\') quoted += '\\';
        quoted += c;
    }
    cells_.emplace_back(key, quoted + "\"");
    return *this;
}

Row& Row::add(const std::string& key, double value, int precision) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", precision, value);
    cells_.emplace_back(key, buf);
    return *this;
}

Row& Row::add(const std::string& key, long long value) {
    cells_.emplace_back(key, std::to_string(value));
    return *this;
}

std::string Row::json() const {
    std::string s = "{";
    for (size_t i = 0; i < cells_.size(); ++i) {
        if (i) s += ",";
        s += "\"" + cells_[i].first + "\":" + cells_[i].second;
    }
    return s + "}";
}

void print_rows(std::ostream& os, const std::vector<Row>& rows, bool json) {
    if (json) {
        for (const Row& r : rows) os << r.json() << "\n";
        return;
    }
    if (rows.empty()) return;
    // Columns: union of keys in first-seen order; strings shown without their quotes.
    std::vector<std::string> keys;
    for (const Row& r : rows) {
        for (const auto& [k, v] : r.cells()) {
            if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
        }
    }
    auto text = [](const Row& r, const std::string& key) -> std::string {
        for (const auto& [k, v] : r.cells()) {
            if (k == key) return v.size() >= 2 && v.front() == '"' ? v.substr(1, v.size() - 2) : v;
        }
        return "";
    };
    std::vector<size_t> width(keys.size());
    for (size_t c = 0; c < keys.size(); ++c) {
        width[c] = keys[c].size();
        for (const Row& r : rows) width[c] = std::max(width[c], text(r, keys[c]).size());
    }
    auto line = [&](auto&& cell) {
        for (size_t c = 0; c < keys.size(); ++c) {
            const std::string s = cell(c);
            os << (c ? "  " : "") << s;
            if (c + 1 < keys.size()) os << std::string(width[c] - s.size(), ' ');
        }
        os << "\n";
    };
    line([&](size_t c) { return keys[c]; });
    line([&](size_t c) { return std::string(width[c], '-'); });
    for (const Row& r : rows) line([&](size_t c) { return text(r, keys[c]); });
}

bool openblas_sgemm(const float* a, const float* w, float* d, int64_t m, int64_t n, int64_t k, int threads) {
#if defined(FP8KIT_BENCH_OPENBLAS)
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(n), blasint(k), 1.0f, a, blasint(k), w,
                blasint(k), 0.0f, d, blasint(n));
    return true;
#else
    (void)a, (void)w, (void)d, (void)m, (void)n, (void)k, (void)threads;
    return false;
#endif
}

}  // namespace fp8kit::bench
