// src/io/safetensors.cpp: the safetensors reader (strict header validation, zero-copy tensors over
// a read-only mapping) and writer (replace-on-write), on src/platform and nlohmann-json.
// Checked against the byte-level spec and the safetensors Python package / PyTorch
// (tests/unit/test_safetensors.cpp, tests/golden/test_safetensors_py.cpp) and fuzzed
// (tests/fuzz/fuzz_safetensors.cpp).
#include "fp8kit/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "io/json.hpp"
#include "platform/platform.hpp"

namespace fp8kit {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping here");

namespace {

using detail::Json;  // ordered: names() is file order
using detail::shown;

struct DTypeName {
    DType dtype;
    std::string_view name;
};
constexpr DTypeName dtype_names[] = {
    {DType::e4m3fn, "F8_E4M3"}, {DType::e5m2, "F8_E5M2"}, {DType::e4m3fnuz, "F8_E4M3FNUZ"},
    {DType::e5m2fnuz, "F8_E5M2FNUZ"}, {DType::e8m0fnu, "F8_E8M0"}, {DType::bf16, "BF16"},
    {DType::f16, "F16"}, {DType::f32, "F32"}, {DType::f64, "F64"}, {DType::i8, "I8"},
    {DType::i16, "I16"}, {DType::i32, "I32"}, {DType::i64, "I64"}, {DType::u8, "U8"},
    {DType::u16, "U16"}, {DType::u32, "U32"}, {DType::u64, "U64"}, {DType::boolean, "BOOL"}};

constexpr int header_max_depth = 16;  // a valid header nests 3 deep (header, entry, shape)

uint64_t read_le64(const unsigned char* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

uint64_t unsigned_field(const Json& v, const std::string& where) {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
        throw Error(where + " is " + shown(v) + ", expected a non-negative integer");
    }
    return v.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& name, const Json& v, const std::string& what) {
    const std::string where = what + ": tensor " + quote_printable(name);
    if (!v.is_object()) throw Error(where + " is " + std::string(v.type_name()) + ", expected an object");
    for (const auto& [k, _] : v.items()) {
        if (k != "dtype" && k != "shape" && k != "data_offsets") {
            throw Error(where + " has an unknown field " + quote_printable(k) + " (expected dtype, shape, data_offsets)");
        }
    }
    for (const char* k : {"dtype", "shape", "data_offsets"}) {
        if (!v.contains(k)) throw Error(where + " has no " + quote_printable(k));
    }
    SafetensorsEntry e{name, DType::u8, {}, 0, 0};
    const Json& dt = v["dtype"];
    if (!dt.is_string()) throw Error(where + ": dtype is " + shown(dt) + ", expected a string");
    const auto d = parse_safetensors_dtype(dt.get_ref<const std::string&>());
    if (!d) throw Error(where + " has an unknown dtype " + shown(dt));
    e.dtype = *d;
    const Json& shape = v["shape"];
    if (!shape.is_array()) throw Error(where + ": shape is " + shown(shape) + ", expected an array");
    // Element count and bytes, refusing anything that overflows 64 bits.
    uint64_t numel = 1;
    bool overflow = false, empty = false;
    for (const Json& dim : shape) {
        const uint64_t n = unsigned_field(dim, where + ": shape dimension");
        if (n > uint64_t(INT64_MAX)) throw Error(where + ": shape dimension " + std::to_string(n) + " is too large");
        e.shape.push_back(int64_t(n));
        if (n == 0) empty = true;
        else if (numel > UINT64_MAX / n) overflow = true;
        numel *= n;
    }
    const Json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) throw Error(where + ": data_offsets is " + shown(off) + ", expected [begin, end]");
    e.begin = unsigned_field(off[0], where + ": data_offsets[0]");
    e.end = unsigned_field(off[1], where + ": data_offsets[1]");
    if (e.end < e.begin) throw Error(where + ": data_offsets " + shown(off) + " end before they begin");
    const uint64_t elem = dtype_size(e.dtype);
    if (empty) {
        overflow = false;
        numel = 0;
    }
    if (overflow || numel > UINT64_MAX / elem || numel * elem != e.end - e.begin) {
        throw Error(where + ": data_offsets " + shown(off) + " hold " + std::to_string(e.end - e.begin) +
                    " bytes, but dtype " + printable(dt.get<std::string>()) + " x shape " + to_string(e.shape) +
                    (overflow ? " overflows 64 bits" : " needs " + std::to_string(numel * elem)));
    }
    return e;
}

}  // namespace

std::string_view safetensors_dtype_name(DType d) noexcept {
    for (const auto& n : dtype_names) {
        if (n.dtype == d) return n.name;
    }
    return "?";
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) noexcept {
    for (const auto& n : dtype_names) {
        if (n.name == name) return n.dtype;
    }
    return std::nullopt;
}

SafetensorsHeader parse_safetensors(const void* data, size_t size, const std::string& what) {
    const auto* p = static_cast<const unsigned char*>(data);
    if (size < 8) {
        throw Error(what + ": file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
    }
    const uint64_t n = read_le64(p);
    if (n > safetensors_max_header) {
        throw Error(what + ": header length " + std::to_string(n) + " is over the limit of " +
                    std::to_string(safetensors_max_header) + " bytes (100 MB)");
    }
    if (n > size - 8) {
        throw Error(what + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                    std::to_string(size) + " bytes)");
    }
    const char* h = reinterpret_cast<const char*>(p + 8);
    // JSON allows no NUL byte; padding is spaces (as the safetensors package writes and requires).
    if (const void* nul = std::memchr(h, 0, size_t(n))) {
        throw Error(what + ": header holds a NUL byte at offset " + std::to_string(static_cast<const char*>(nul) - h) +
                    " (JSON allows none; a header is padded with spaces)");
    }
    const Json j = detail::parse_json(std::string_view(h, n), what + " header", header_max_depth, true);
    if (!j.is_object()) throw Error(what + ": header is a JSON " + std::string(j.type_name()) + ", expected an object");

    SafetensorsHeader out;
    out.data_offset = 8 + n;
    const uint64_t data_size = size - out.data_offset;
    for (const auto& [key, v] : j.items()) {
        if (key == "__metadata__") {
            if (!v.is_object()) throw Error(what + ": __metadata__ is " + shown(v) + ", expected an object of strings");
            for (const auto& [mk, mv] : v.items()) {
                if (!mv.is_string()) {
                    throw Error(what + ": __metadata__ value of " + quote_printable(mk) + " is " + shown(mv) + ", expected a string");
                }
                out.metadata.emplace(mk, mv.get<std::string>());
            }
            continue;
        }
        SafetensorsEntry e = parse_entry(key, v, what);
        if (e.end > data_size) {
            throw Error(what + ": tensor " + quote_printable(key) + ": data_offsets [" + std::to_string(e.begin) + ", " +
                        std::to_string(e.end) + "] out of bounds: the data section has " +
                        std::to_string(data_size) + " bytes");
        }
        out.entries.push_back(std::move(e));
    }
    // The data must tile the data section exactly: in offset order, each tensor starts where the
    // previous one ended, the first at 0 and the last at the end.
    std::vector<size_t> order(out.entries.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const auto& x = out.entries[a];
        const auto& y = out.entries[b];
        return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
    });
    uint64_t at = 0;
    const SafetensorsEntry* prev = nullptr;
    for (size_t i : order) {
        const SafetensorsEntry& e = out.entries[i];
        if (e.begin < at) {
            throw Error(what + ": tensors " + quote_printable(prev->name) + " and " + quote_printable(e.name) + " overlap (bytes [" +
                        std::to_string(e.begin) + ", " + std::to_string(at) + ") of the data section)");
        }
        if (e.begin > at) {
            throw Error(what + ": gap in the data section: bytes [" + std::to_string(at) + ", " +
                        std::to_string(e.begin) + ") belong to no tensor (before " + quote_printable(e.name) + ")");
        }
        at = e.end;
        prev = &e;
    }
    if (at != data_size) {
        throw Error(what + ": the data section has " + std::to_string(data_size) + " bytes but the tensors cover " +
                    std::to_string(at) + " (trailing bytes belong to no tensor)");
    }
    return out;
}

// ---- SafetensorsFile ----

struct SafetensorsFile::Impl {
    platform::MappedFile file;
    SafetensorsHeader header;
    std::vector<std::string> names;
    std::unordered_map<std::string, size_t> index;
};

SafetensorsFile::SafetensorsFile(const std::string& path) {
    auto impl = std::make_shared<Impl>();
    impl->file = platform::MappedFile(path);
    impl->header = parse_safetensors(impl->file.data(), impl->file.size(), path);
    for (size_t i = 0; i < impl->header.entries.size(); ++i) {
        impl->names.push_back(impl->header.entries[i].name);
        impl->index.emplace(impl->header.entries[i].name, i);
    }
    impl_ = std::move(impl);
}

const std::string& SafetensorsFile::path() const noexcept { return impl_->file.path(); }
const std::vector<std::string>& SafetensorsFile::names() const noexcept { return impl_->names; }
bool SafetensorsFile::contains(const std::string& name) const noexcept { return impl_->index.count(name) != 0; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const noexcept { return impl_->header.metadata; }
uint64_t SafetensorsFile::data_offset() const noexcept { return impl_->header.data_offset; }

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
    const auto it = impl_->index.find(name);
    if (it == impl_->index.end()) throw Error(path() + ": no tensor named " + quote_printable(name));
    return impl_->header.entries[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
    const SafetensorsEntry& e = entry(name);
    const std::byte* p = impl_->file.data() + impl_->header.data_offset + e.begin;
    const size_t bytes = size_t(e.end - e.begin);
    if (bytes != 0 && reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) == 0) {
        return Tensor::view_of(impl_, p, e.shape, e.dtype, path() + ": " + name);
    }
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (bytes != 0) std::memcpy(t.raw_data(), p, bytes);
    return t;
}

// ---- writer ----

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
    Json header = Json::object();
    if (!metadata.empty()) {
        Json m = Json::object();
        for (const auto& [k, v] : metadata) m[k] = v;
        header["__metadata__"] = std::move(m);
    }
    std::vector<Tensor> data;
    uint64_t at = 0;
    for (const auto& [name, t] : tensors) {
        const std::string where = "fp8kit::save_safetensors: " + path + ": tensor " + quote_printable(name);
        if (name == "__metadata__") throw Error(where + ": the name is reserved for the metadata");
        if (header.contains(name)) throw Error(where + " appears twice (duplicate name)");
        if (!t.defined()) throw Error(where + " is undefined");
        if (t.device() != Device::cpu) throw Error(where + " is on " + std::string(to_string(t.device())) + ", expected cpu");
        Json shape = Json::array();
        for (int64_t d : t.shape()) shape.push_back(d);
        header[name] = {{"dtype", safetensors_dtype_name(t.dtype())}, {"shape", std::move(shape)},
                        {"data_offsets", {at, at + t.nbytes()}}};
        at += t.nbytes();
        data.push_back(t.contiguous());
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const Json::exception& e) {
        throw Error("fp8kit::save_safetensors: " + path + ": a name or metadata string is not valid UTF-8 (" + e.what() + ")");
    }
    text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
    platform::ReplacingFile out(path);
    out.write(len, 8);
    out.write(text.data(), text.size());
    for (const Tensor& t : data) {
        if (t.nbytes() != 0) out.write(t.const_raw_data(), t.nbytes());
    }
    out.commit();
}

}  // namespace fp8kit
