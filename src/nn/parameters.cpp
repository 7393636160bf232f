// src/nn/parameters.cpp: a module's parameters as a safetensors file (fp8kit/safetensors.hpp):
// one float32 tensor per parameter under its qualified name ("blocks.0.attn.qkv.weight"), and
// the caller's metadata in __metadata__ (what it needs to rebuild the module; the GPT app of
// tools/gpt writes its shape). save_safetensors writes through a temporary file renamed over the
// path: a failure never leaves a half-written file.
// load_parameters reads that file, or a directory of shards (fp8kit::Checkpoint), also after
// `fp8kit quantize` (every layout of fp8kit/checkpoint.hpp):
// a Linear weight in FP8 is kept so (Parameter::stored: Linear::forward computes with it
// directly), any other FP8 tensor is dequantized. It refuses, with an fp8kit::Error naming the
// file and the problem: a parameter's tensor missing, of the wrong shape or dtype (FP8 without a
// scale, or a scale no layout explains), an FP8 weight holding a NaN or Inf code, a tensor the
// module has no parameter for. The module
// keeps no view of the file: every tensor is copied out of the mapping.
// Checked by tests/nn/test_parameters.cpp (a module's round trip; through the GPT app's model
// files: bit-exact round trip, each malformed file, every FP8 layout of a trained model above
// the SQNR floors of docs/NUMERICS.md against its float32 logits) and the CLI e2e tests (train, then generate from the saved file
// and from its quantized copy).
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/nn.hpp"
#include "fp8kit/safetensors.hpp"

namespace fp8kit::nn {

void save_parameters(const Module& model, const std::string& path, const std::map<std::string, std::string>& metadata) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, p] : model.named_parameters()) tensors.emplace_back(name, p->compute_value());
    save_safetensors(path, tensors, metadata);
}

void load_parameters(Module& model, const Checkpoint& st) {
    const TensorLookup& file = st;
    const std::string where = "fp8kit::nn::load_parameters: " + quote_printable(st.path());
    // Which parameters are Linear weights: those keep an FP8 copy and compute with it.
    std::set<const Parameter*> linear_weights;
    for (const auto& [name, m] : model.named_modules())
        if (const auto* l = dynamic_cast<const Linear*>(m)) linear_weights.insert(&l->weight());
    std::set<std::string> unused(st.names().begin(), st.names().end());
    for (auto& [name, p] : model.named_parameters()) {
        if (!st.contains(name)) throw Error(where + " has no tensor " + quote_printable(name));
        const SafetensorsEntry& e = st.entry(name);
        if (e.shape != p->value.shape())
            throw Error(where + ": " + quote_printable(name) + " is " + to_string(e.shape) + ", the model expects " + to_string(p->value.shape()));
        std::optional<StoredWeight> fp8;
        try {
            fp8 = stored_weight(file, name);  // an FP8 weight with its scale, as fp8kit quantize writes it
        } catch (const Error& err) {
            throw Error("fp8kit::nn::load_parameters: " + std::string(err.what()));
        }
        if (fp8) check_codes_finite(*fp8, name, where);
        if (fp8 && linear_weights.count(p.get())) {
            // Kept in FP8: inference-only, as layerwise casting. Copied out of the mapping (one
            // byte per weight) like every other tensor, so the model does not hold the file open -
            // Windows refuses to replace a file that is still mapped (saving back to the same path).
            p->stored = fp8->q;
            p->stored->data = fp8->q.data.clone();
            p->stored->scale_inv = fp8->q.scale_inv.clone();
            p->value = Tensor();
            p->grad = Tensor();
        } else if (fp8) {
            p->value = dequantize(fp8->q, DType::f32);
        } else if (e.dtype != DType::f32) {
            throw Error(where + ": " + quote_printable(name) + " is " + std::string(safetensors_dtype_name(e.dtype)) +
                        (is_fp8(e.dtype) ? " without a scale tensor (" + name + "_scale or _scale_inv)" : ", expected F32"));
        } else {
            p->value = st.tensor(name).clone();  // the file's tensors are read-only views of the mapping
        }
        unused.erase(name);
        if (fp8) unused.erase(fp8->scale);
    }
    if (!unused.empty()) throw Error(where + " has an unexpected tensor " + quote_printable(*unused.begin()));
}

}  // namespace fp8kit::nn
