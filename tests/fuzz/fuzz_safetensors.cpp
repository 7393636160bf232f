// tests/fuzz/fuzz_safetensors.cpp: libFuzzer target over what fp8kit reads from a checkpoint - the
// safetensors parser, shard indexes and scale tensors. The input's prefix picks the reader:
//   "index:" JSON      a model.safetensors.index.json beside two fixed shards (a.safetensors:
//                      x, y; b.safetensors: z), opened as a fp8kit::Checkpoint directory;
//   "scale:" CONFIG \n TENSORS
//                      a quantization_config (JSON text, or an empty line for none) and tensors
//                      described as JSON {name: {"dtype", "shape", "values" | "fill"}} (text, so
//                      that seeds are readable and the dictionary's tokens mutate them), looked up
//                      by fp8kit::stored_weight / is_scale_name for every name;
//   anything else      the bytes of a safetensors file (fp8kit::parse_safetensors).
// Any input must either be refused with an fp8kit::Error or give results that satisfy the
// format's invariants, checked here independently of the readers: the data section tiled exactly
// and each range dtype size x numel bytes; every name a Checkpoint lists readable from its shard;
// a stored weight's scales finite and positive (e8m0: not its NaN code), of the shape its scaling
// gives its matrix, and dequantizing without error. ASan and UBSan catch memory and arithmetic
// errors. tests/CMakeLists.txt builds it with libFuzzer under clang (ctest fuzz_safetensors, label
// fuzz, 20 s from tests/fuzz/corpus) and, in every build, with tests/fuzz/replay.cpp as a replay of
// the corpus (label unit).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/safetensors.hpp"

namespace {

using namespace fp8kit;

void check_header(const uint8_t* data, size_t size) {
    SafetensorsHeader h;
    try {
        h = parse_safetensors(data, size, "fuzz input");
    } catch (const Error&) {
        return;
    }
    if (h.data_offset < 8 || h.data_offset > size) std::abort();
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const SafetensorsEntry& e : h.entries) {
        uint64_t numel = 1;
        for (int64_t d : e.shape) {
            if (d < 0) std::abort();
            numel *= uint64_t(d);
        }
        if (e.end - e.begin != numel * dtype_size(e.dtype)) std::abort();
        ranges.emplace_back(e.begin, e.end);
    }
    std::sort(ranges.begin(), ranges.end());
    uint64_t at = 0;
    for (const auto& [b, e] : ranges) {
        if (b != at || e < b) std::abort();
        at = e;
    }
    if (at != size - h.data_offset) std::abort();
}

// A shard index against two fixed shards, through the Checkpoint a command opens.
void check_index(std::string_view index) {
    namespace fs = std::filesystem;
    static const fs::path dir = fs::temp_directory_path() / ("fp8kit_fuzz_index_" + std::to_string(std::random_device{}()));
    static const bool made = [] {
        fs::create_directories(dir);
        std::atexit([] {
            std::error_code ec;
            fs::remove_all(dir, ec);
        });
        const Tensor one = Tensor::zeros({2}, DType::f32);
        save_safetensors((dir / "a.safetensors").string(), {{"x", one}, {"y", one}});
        save_safetensors((dir / "b.safetensors").string(), {{"z", one}});
        return true;
    }();
    (void)made;
    write_file((dir / "model.safetensors.index.json").string(), index);
    try {
        const Checkpoint c(dir.string());
        for (const std::string& name : c.names()) {
            if (c.tensor(name).numel() != 2) std::abort();  // every listed name reads from its shard
        }
        for (const std::string& f : c.shard_files())
            if (f != "a.safetensors" && f != "b.safetensors") std::abort();  // nothing outside the directory
    } catch (const Error&) {
    }
}

// Tensors in memory: what stored_weight reads through the TensorLookup interface.
class MemoryLookup final : public TensorLookup {
public:
    std::map<std::string, Tensor> tensors;
    std::map<std::string, std::string> meta;
    const std::string& path() const noexcept override { return path_; }
    bool contains(const std::string& name) const noexcept override { return tensors.count(name) != 0; }
    Tensor tensor(const std::string& name) const override {
        const auto it = tensors.find(name);
        if (it == tensors.end()) throw Error("no tensor " + quote_printable(name));
        return it->second;
    }
    const std::map<std::string, std::string>& metadata() const override { return meta; }

private:
    std::string path_ = "fuzz input";
};

// A tensor from {"dtype", "shape", "values" (cycled) | "fill"}; std::nullopt for a malformed one.
std::optional<Tensor> tensor_of(const nlohmann::json& j) {
    if (!j.is_object() || !j.contains("dtype") || !j["dtype"].is_string() || !j.contains("shape") || !j["shape"].is_array()) return std::nullopt;
    const auto dtype = parse_safetensors_dtype(j["dtype"].get<std::string>());
    if (!dtype || j["shape"].size() > 4) return std::nullopt;
    Shape shape;
    int64_t numel = 1;
    for (const auto& d : j["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > 4096) return std::nullopt;
        shape.push_back(d.get<int64_t>());
        numel *= shape.back();
        if (numel > 65536) return std::nullopt;
    }
    std::vector<double> values;
    if (j.contains("values") && j["values"].is_array())
        for (const auto& v : j["values"])
            if (v.is_number()) values.push_back(v.get<double>());
    if (values.empty()) values.push_back(j.contains("fill") && j["fill"].is_number() ? j["fill"].get<double>() : 0.0);
    Tensor t = Tensor::empty(shape, *dtype);
    for (int64_t i = 0; i < numel; ++i) {
        const double v = values[size_t(i) % values.size()];
        const auto code = static_cast<uint8_t>(std::isfinite(v) ? int64_t(std::fmod(std::fabs(v), 256.0)) : 0);
        switch (*dtype) {
            case DType::f32: t.data<float>()[i] = float(v); break;
            case DType::bf16: t.data<bf16>()[i] = bf16(float(v)); break;
            case DType::f16: t.data<f16>()[i] = f16(float(v)); break;
            case DType::f64: t.data<double>()[i] = v; break;
            case DType::i32: t.data<int32_t>()[i] = std::isfinite(v) && std::fabs(v) < 2e9 ? int32_t(v) : 0; break;
            default: std::memset(static_cast<std::byte*>(t.raw_data()) + i * int64_t(dtype_size(*dtype)), code, dtype_size(*dtype));
        }
    }
    return t;
}

void check_scales(std::string_view text) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return;
    MemoryLookup lookup;
    if (nl > 0) lookup.meta["quantization_config"] = std::string(text.substr(0, nl));
    const nlohmann::json j = nlohmann::json::parse(text.substr(nl + 1), nullptr, false);
    if (!j.is_object()) return;
    for (const auto& [name, spec] : j.items())
        if (const auto t = tensor_of(spec)) lookup.tensors.emplace(name, *t);
    for (const auto& [name, _] : lookup.tensors) {
        try {
            (void)is_scale_name(lookup, name);
            const auto w = stored_weight(lookup, name);
            if (!w) continue;
            const QTensor& q = w->q;
            if (q.data.dim() != 2) std::abort();
            const GroupShape gs = q.scaling.scale_shape(q.data.size(0), q.data.size(1));
            if (q.scale_inv.shape() != Shape{gs.rows, gs.cols}) std::abort();
            const Tensor s = q.scale_inv.contiguous();
            for (int64_t i = 0; i < s.numel(); ++i) {
                const float v = s.dtype() == DType::e8m0fnu ? decode(s.data<const uint8_t>()[i], Format::e8m0fnu) : s.data<const float>()[i];
                if (!(std::isfinite(v) && v > 0)) std::abort();  // the rule: scales finite and positive
            }
            (void)dequantize(q, DType::f32);
        } catch (const Error&) {
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    if (text.substr(0, 6) == "index:") check_index(text.substr(6));
    else if (text.substr(0, 6) == "scale:") check_scales(text.substr(6));
    else check_header(data, size);
    return 0;
}
