// src/nn/checkpoint.cpp: saving and loading a GPT as a safetensors file (fp8kit/safetensors.hpp):
// one float32 tensor per parameter under its qualified name ("blocks.0.attn.qkv.weight"), and
// the GPTConfig in __metadata__ (GPTConfig::to_metadata: "fp8kit.model": "gpt", "gpt.layers" ...).
// save_safetensors writes through a temporary file renamed over the path: a failure never leaves
// a half-written model.
// load_model refuses, with an fp8kit::Error naming the file and the problem: metadata missing or
// invalid, a parameter's tensor missing, of the wrong shape or dtype, a tensor the model has no
// parameter for.
// Checked by tests/nn/test_checkpoint.cpp (bit-exact round trip, each malformed file) and the
// CLI e2e test (train, then generate from the saved file).
#include <map>
#include <set>

#include "fp8kit/nn.hpp"
#include "fp8kit/safetensors.hpp"

namespace fp8kit::nn {

void save_model(const GPT& model, const std::string& path) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p->compute_value());
    save_safetensors(path, tensors, model.config().to_metadata());
}

std::unique_ptr<GPT> load_model(const std::string& path) {
    const SafetensorsFile file(path);  // opening errors name the file
    const std::string where = "fp8kit::nn::load_model: '" + path + "'";
    GPTConfig config;
    try {
        config = GPTConfig::from_metadata(file.metadata());
    } catch (const Error& e) {
        throw Error(where + ": " + e.what());
    }
    auto model = std::make_unique<GPT>(config, 0);
    std::set<std::string> unused(file.names().begin(), file.names().end());
    for (auto& [name, p] : model->named_parameters()) {
        if (!file.contains(name)) throw Error(where + " has no tensor '" + name + "'");
        const SafetensorsEntry& e = file.entry(name);
        if (e.dtype != DType::f32)
            throw Error(where + ": '" + name + "' is " + std::string(safetensors_dtype_name(e.dtype)) + ", expected F32");
        if (e.shape != p->value.shape())
            throw Error(where + ": '" + name + "' is " + to_string(e.shape) + ", the model expects " + to_string(p->value.shape()));
        p->value = file.tensor(name).clone();  // the file's tensors are read-only views of the mapping
        unused.erase(name);
    }
    if (!unused.empty()) throw Error(where + " has an unexpected tensor '" + *unused.begin() + "'");
    return model;
}

}  // namespace fp8kit::nn
