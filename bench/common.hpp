// bench/common.hpp: what every fp8kit benchmark shares - options, best-of timing, the memcpy
// peer, the clock estimate, and output as a human table or JSON lines (format in DESIGN.md).
#pragma once

#include <cstddef>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace fp8kit::bench {

struct Options {
    bool json = false;   // one JSON object per line instead of the table
    bool quick = false;  // fewer cases and repetitions: under a minute on 2 cores
};

// Best (minimum) seconds per call of fn over repeated runs lasting about `budget` seconds
// (at least 3 runs after one warm-up). The minimum is the least disturbed by other load.
double best_seconds(const std::function<void()>& fn, double budget);

// memcpy of `bytes` split over `threads` threads in contiguous ranges, as the kernels split.
void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads);

// Reads `bytes` (a multiple of 8) split over `threads` threads and returns their sum, so the
// compiler cannot drop it: the read-bandwidth peer of a conversion that mostly reads.
unsigned long long parallel_read(const void* src, size_t bytes, int threads);

// Nominal clock in GHz from the CPU's time-stamp counter (0 where there is none). Elements per
// cycle are reported against this clock; turbo clocks make the true per-cycle figure lower.
double tsc_ghz();

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

}  // namespace fp8kit::bench
