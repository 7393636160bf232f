// tests/fuzz/replay.cpp: a main() for the libFuzzer target tests/fuzz/fuzz_safetensors.cpp that
// runs it once on each file named on the command line (a directory: each file in it, in name
// order) - the seed corpus replayed in builds without libFuzzer (g++; the asan preset runs it under
// ASan + UBSan), or one crashing input found by the fuzzer. The target aborts on any broken
// invariant; this fails when a file cannot be read or no input was given.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
    namespace fs = std::filesystem;
    std::vector<fs::path> inputs;
    for (int i = 1; i < argc; ++i) {
        std::error_code ec;
        if (fs::is_directory(argv[i], ec)) {
            for (const auto& e : fs::directory_iterator(argv[i])) {
                if (e.is_regular_file()) inputs.push_back(e.path());
            }
        } else {
            inputs.emplace_back(argv[i]);
        }
    }
    std::sort(inputs.begin(), inputs.end());
    if (inputs.empty()) {
        std::fprintf(stderr, "usage: %s FILE|DIRECTORY... (no input files found)\n", argv[0]);
        return 1;
    }
    for (const fs::path& p : inputs) {
        std::ifstream in(p, std::ios::binary);
        if (!in) {
            std::fprintf(stderr, "%s: cannot read\n", p.string().c_str());
            return 1;
        }
        const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    }
    std::printf("%zu inputs replayed through the safetensors parser, shard indexes and scale tensors\n", inputs.size());
    return 0;
}
