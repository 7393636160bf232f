// fp8kit/safetensors.hpp: reading and writing safetensors files (Hugging Face's checkpoint format):
// an 8-byte little-endian header length N, N bytes of JSON header {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {string: string}}, then the tensors' bytes,
// little-endian, row-major, offsets relative to the end of the header.
//
// Reading maps the file (zero copy) and validates the whole header on open; every problem is an
// fp8kit::Error naming the file and what was wrong: a header length beyond the file or over
// 100 MB, JSON that is invalid or repeats a key, an unknown dtype, offsets out of bounds,
// overlapping, unordered or gapped data, a byte count that is not dtype size x shape, a duplicate
// name. Writing goes to a temporary file renamed over the path when complete (replace-on-write).
//
// Checked against the byte-level spec (hand-written files) and the `safetensors` Python package
// and PyTorch, both ways, in tests/unit/test_safetensors.cpp and tests/golden/test_safetensors_py.cpp;
// the parser is fuzzed by tests/fuzz/fuzz_safetensors.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8kit/dtype.hpp"
#include "fp8kit/tensor.hpp"

namespace fp8kit {

// safetensors dtype names ("F8_E4M3", "BF16", "I64", "BOOL" ...) and fp8kit's DType. F8_E4M3 is
// e4m3fn and F8_E8M0 is e8m0fnu (the names PyTorch's float8_e4m3fn / float8_e8m0fnu save under).
std::string_view safetensors_dtype_name(DType d) noexcept;
std::optional<DType> parse_safetensors_dtype(std::string_view name) noexcept;

// The largest header fp8kit reads (as the reference implementation: 100 MB).
inline constexpr uint64_t safetensors_max_header = 100'000'000;

// Writes tensors in the given order plus string metadata (__metadata__), replace-on-write. Tensors
// must be on the CPU (any strides: non-contiguous ones are written in row-major order) and names
// unique and not "__metadata__"; fp8kit::Error otherwise, and nothing is written.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor's entry in the header.
struct SafetensorsEntry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;  // byte range in the data section (after the header)
};

// A validated safetensors file, mapped read-only. Tensors handed out share the mapping (it stays
// mapped while any of them lives); they are read-only memory: copy (clone()) to modify.
class SafetensorsFile {
public:
    explicit SafetensorsFile(const std::string& path);

    const std::string& path() const noexcept;
    const std::vector<std::string>& names() const noexcept;  // file (header) order
    bool contains(const std::string& name) const noexcept;
    const SafetensorsEntry& entry(const std::string& name) const;  // fp8kit::Error if absent
    // A zero-copy view into the mapping when the data is aligned to its element size (keeps the
    // mapping alive), else a copy. fp8kit::Error if absent.
    Tensor tensor(const std::string& name) const;
    const std::map<std::string, std::string>& metadata() const noexcept;
    uint64_t data_offset() const noexcept;  // where the data section starts in the file: 8 + N

    struct Impl;

private:
    std::shared_ptr<const Impl> impl_;
};

// The parser alone, over bytes in memory (what SafetensorsFile runs on the mapping; the fuzzer
// drives it): the entries in header order and the metadata, or fp8kit::Error mentioning `what`.
struct SafetensorsHeader {
    std::vector<SafetensorsEntry> entries;
    std::map<std::string, std::string> metadata;
    uint64_t data_offset = 0;
};
SafetensorsHeader parse_safetensors(const void* data, size_t size, const std::string& what);

}  // namespace fp8kit
