// tests/fuzz/fuzz_safetensors.cpp: libFuzzer target over the safetensors parser
// (fp8kit::parse_safetensors, what SafetensorsFile runs on a mapped file). Any input must either
// be refused with an fp8kit::Error or give entries that satisfy the format's invariants, checked
// here independently of the parser: the data section is tiled exactly (sorted by offset, each range
// starts where the previous ended, from 0 to the end), and each range holds dtype size x numel
// bytes. ASan and UBSan catch memory and arithmetic errors. tests/CMakeLists.txt builds it with
// libFuzzer under clang (ctest fuzz_safetensors, label fuzz, 20 s from tests/fuzz/corpus) and,
// in every build, with tests/fuzz/replay.cpp as a replay of the corpus (label unit).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fp8kit/error.hpp"
#include "fp8kit/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fp8kit::SafetensorsHeader h;
    try {
        h = fp8kit::parse_safetensors(data, size, "fuzz input");
    } catch (const fp8kit::Error&) {
        return 0;
    }
    if (h.data_offset < 8 || h.data_offset > size) std::abort();
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const fp8kit::SafetensorsEntry& e : h.entries) {
        uint64_t numel = 1;
        for (int64_t d : e.shape) {
            if (d < 0) std::abort();
            numel *= uint64_t(d);
        }
        if (e.end - e.begin != numel * fp8kit::dtype_size(e.dtype)) std::abort();
        ranges.emplace_back(e.begin, e.end);
    }
    std::sort(ranges.begin(), ranges.end());
    uint64_t at = 0;
    for (const auto& [b, e] : ranges) {
        if (b != at || e < b) std::abort();
        at = e;
    }
    if (at != size - h.data_offset) std::abort();
    return 0;
}
