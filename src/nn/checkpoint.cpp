// src/nn/checkpoint.cpp: saving and loading a GPT. Interim file format, until the project's
// safetensors reader/writer (include/fp8kit/safetensors.hpp, branch io) lands; then
// write_tensors / read_tensors switch to save_safetensors / SafetensorsFile with the same
// arguments, and nothing else changes.
//
// Interim format "FP8KNN01" (little-endian):
//   8 bytes magic "FP8KNN01"
//   u32 metadata count, then per entry: u32 key length, key bytes, u32 value length, value bytes
//   u32 tensor count, then per tensor: u32 name length, name bytes, u32 rank, i64 dims[rank],
//   float32 values (row-major, product of dims of them)
// Written through platform::ReplacingFile (temporary + fsync + rename): a failure never leaves a
// half-written model.
// Checked by tests/nn/test_train.cpp (save, load, identical logits) and the CLI e2e test.
#include <bit>
#include <fstream>
#include <map>

#include "fp8kit/nn.hpp"
#include "platform/platform.hpp"

namespace fp8kit::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "the interim checkpoint format is little-endian");
constexpr char magic[9] = "FP8KNN01";

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

template <class T>
void put(std::string& out, const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_string(std::string& out, const std::string& s) {
    put(out, uint32_t(s.size()));
    out.append(s);
}

void write_tensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
    std::string head(magic, 8);
    put(head, uint32_t(metadata.size()));
    for (const auto& [k, v] : metadata) {
        put_string(head, k);
        put_string(head, v);
    }
    put(head, uint32_t(tensors.size()));
    platform::ReplacingFile out(path);  // nothing at `path` changes unless commit() is reached
    out.write(head.data(), head.size());
    for (const auto& [name, t] : tensors) {
        const Tensor c = t.contiguous();
        std::string h;
        put_string(h, name);
        put(h, uint32_t(c.dim()));
        for (int64_t d : c.shape()) put(h, d);
        out.write(h.data(), h.size());
        out.write(c.data<float>(), c.nbytes());
    }
    out.commit();
}

struct Reader {
    std::ifstream in;
    std::string path;
    template <class T>
    T get() {
        T v{};
        in.read(reinterpret_cast<char*>(&v), sizeof v);
        if (!in) throw Error("fp8kit::nn::load_model: '" + path + "' is truncated");
        return v;
    }
    std::string get_string() {
        const uint32_t n = get<uint32_t>();
        if (n > (1u << 20)) throw Error("fp8kit::nn::load_model: '" + path + "' is corrupt (a string of " + std::to_string(n) + " bytes)");
        std::string s(n, '\0');
        in.read(s.data(), n);
        if (!in) throw Error("fp8kit::nn::load_model: '" + path + "' is truncated");
        return s;
    }
};

NamedTensors read_tensors(const std::string& path, std::map<std::string, std::string>& metadata) {
    Reader r{std::ifstream(path, std::ios::binary), path};
    if (!r.in) throw Error("fp8kit::nn::load_model: cannot open '" + path + "'");
    char m[8] = {};
    r.in.read(m, 8);
    if (!r.in || std::string(m, 8) != magic) throw Error("fp8kit::nn::load_model: '" + path + "' is not an fp8kit model (no FP8KNN01 header)");
    const uint32_t nmeta = r.get<uint32_t>();
    for (uint32_t i = 0; i < nmeta; ++i) {
        std::string k = r.get_string();
        metadata[k] = r.get_string();
    }
    NamedTensors out;
    const uint32_t count = r.get<uint32_t>();
    for (uint32_t i = 0; i < count; ++i) {
        std::string name = r.get_string();
        const uint32_t rank = r.get<uint32_t>();
        if (rank > 8) throw Error("fp8kit::nn::load_model: '" + path + "': tensor '" + name + "' has rank " + std::to_string(rank));
        Shape s;
        int64_t n = 1;
        for (uint32_t d = 0; d < rank; ++d) {
            s.push_back(r.get<int64_t>());
            if (s.back() < 0 || s.back() > (int64_t(1) << 32)) throw Error("fp8kit::nn::load_model: '" + path + "': bad dimension in '" + name + "'");
            n *= s.back();
        }
        if (n > (int64_t(1) << 32)) throw Error("fp8kit::nn::load_model: '" + path + "': tensor '" + name + "' too large");
        Tensor t = Tensor::empty(s, DType::f32);
        r.in.read(reinterpret_cast<char*>(t.data<float>()), std::streamsize(t.nbytes()));
        if (!r.in) throw Error("fp8kit::nn::load_model: '" + path + "' is truncated");
        out.emplace_back(std::move(name), std::move(t));
    }
    return out;
}

}  // namespace

void save_model(const GPT& model, const std::string& path) {
    NamedTensors tensors;
    for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p->compute_value());
    write_tensors(path, tensors, model.config().to_metadata());
}

std::unique_ptr<GPT> load_model(const std::string& path) {
    std::map<std::string, std::string> metadata;
    const NamedTensors tensors = read_tensors(path, metadata);
    auto model = std::make_unique<GPT>(GPTConfig::from_metadata(metadata), 0);
    std::map<std::string, Tensor> by_name(tensors.begin(), tensors.end());
    for (auto& [name, p] : model->named_parameters()) {
        const auto it = by_name.find(name);
        if (it == by_name.end()) throw Error("fp8kit::nn::load_model: '" + path + "' has no tensor '" + name + "'");
        if (it->second.shape() != p->value.shape())
            throw Error("fp8kit::nn::load_model: '" + path + "': '" + name + "' is " + to_string(it->second.shape()) +
                        ", the model expects " + to_string(p->value.shape()));
        p->value = it->second;
        by_name.erase(it);
    }
    if (!by_name.empty()) throw Error("fp8kit::nn::load_model: '" + path + "' has an unexpected tensor '" + by_name.begin()->first + "'");
    return model;
}

}  // namespace fp8kit::nn
