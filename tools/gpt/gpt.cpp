// tools/gpt/gpt.cpp: the GPT-2-style model of the GPT app - embeddings, pre-norm blocks
// (attention, GELU MLP), final norm, lm_head - its forward/backward through the library's
// modules, GPT-2's initialisation, and its model files (the GPTConfig as metadata of
// nn::save_parameters / nn::load_parameters).
// Checked against the same model in PyTorch on the same weights and tokens
// (tests/nn/test_torch_gpt.cpp: logits, loss and every gradient); the model files by
// tests/nn/test_parameters.cpp (bit-exact round trip, each malformed file, FP8 files).
#include <cmath>
#include <cstdio>
#include <numbers>
#include <random>

#include "fp8kit/checkpoint.hpp"
#include "fp8kit/files.hpp"
#include "fp8kit/runtime.hpp"
#include "fp8kit/ops.hpp"
#include "gpt/gpt.hpp"

namespace fp8kit::gpt {

using nn::CausalSelfAttention;
using nn::Embedding;
using nn::GELU;
using nn::LayerNorm;
using nn::Linear;
using nn::Module;

namespace {

class MLP : public Module {
public:
    explicit MLP(int64_t c) {
        add_child("fc1", std::make_shared<Linear>(c, 4 * c));
        add_child("gelu", std::make_shared<GELU>());
        add_child("fc2", std::make_shared<Linear>(4 * c, c));
    }
    std::string_view kind() const override { return "MLP"; }
    Tensor forward(const Tensor& x) { return child<Linear>(2).forward(child<GELU>(1).forward(child<Linear>(0).forward(x))); }
    Tensor backward(const Tensor& dy) { return child<Linear>(0).backward(child<GELU>(1).backward(child<Linear>(2).backward(dy))); }
};

class Block : public Module {
public:
    Block(int64_t c, int64_t heads) {
        add_child("norm1", std::make_shared<LayerNorm>(c));
        add_child("attn", std::make_shared<CausalSelfAttention>(c, heads));
        add_child("norm2", std::make_shared<LayerNorm>(c));
        add_child("mlp", std::make_shared<MLP>(c));
    }
    std::string_view kind() const override { return "Block"; }
    // x + attn(norm1(x)), then + mlp(norm2(.))
    Tensor forward(const Tensor& x) {
        const Tensor h = Tensor::empty(x.shape(), DType::f32, x.device());
        residual_forward(h, x, child<CausalSelfAttention>(1).forward(child<LayerNorm>(0).forward(x)));
        const Tensor out = Tensor::empty(x.shape(), DType::f32, x.device());
        residual_forward(out, h, child<MLP>(3).forward(child<LayerNorm>(2).forward(h)));
        return out;
    }
    // the residual's gradient passes through, the branch's is added
    Tensor backward(const Tensor& dy) {
        const Tensor dh = Tensor::empty(dy.shape(), DType::f32, dy.device());
        residual_forward(dh, dy, child<LayerNorm>(2).backward(child<MLP>(3).backward(dy)));
        const Tensor dx = Tensor::empty(dy.shape(), DType::f32, dy.device());
        residual_forward(dx, dh, child<LayerNorm>(0).backward(child<CausalSelfAttention>(1).backward(dh)));
        return dx;
    }
};

class ModuleList : public Module {
public:
    std::string_view kind() const override { return "ModuleList"; }
    template <class M>
    void append(std::shared_ptr<M> m) { add_child(std::to_string(children().size()), std::move(m)); }
    template <class M>
    M& at(size_t i) const { return child<M>(i); }
};

// GPT-2's initialisation, reproducible everywhere: N(0, std) from mt19937_64 through Box-Muller
// (std::normal_distribution's algorithm differs between standard libraries).
class Normal {
public:
    explicit Normal(uint64_t seed) : gen_(seed) {}
    float operator()(float stddev) {
        const double u1 = (double(gen_() >> 11) + 1.0) * 0x1p-53, u2 = double(gen_() >> 11) * 0x1p-53;
        return float(double(stddev) * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
    }

private:
    std::mt19937_64 gen_;
};

constexpr size_t tok_i = 0, pos_i = 1, blocks_i = 2, norm_f_i = 3, lm_head_i = 4;

}  // namespace

void GPTConfig::validate() const {
    auto need = [](bool ok, const std::string& what) {
        if (!ok) throw Error("fp8kit::gpt::GPTConfig: " + what);
    };
    need(layers >= 1 && layers <= 1024, "layers must be in [1, 1024], got " + std::to_string(layers));
    need(width >= 1 && width <= 65536, "width must be in [1, 65536], got " + std::to_string(width));
    need(heads >= 1 && width % heads == 0, "width " + std::to_string(width) + " is not a multiple of heads " + std::to_string(heads));
    need(context >= 1 && context <= 65536, "context must be in [1, 65536], got " + std::to_string(context));
    need(vocab >= 1 && vocab <= (int64_t(1) << 24), "vocab must be in [1, 2^24], got " + std::to_string(vocab));
    check_fits_memory(parameter_bytes(), "fp8kit::gpt::GPTConfig: a GPT of " + std::to_string(layers) + " layers, width " +
                                             std::to_string(width) + ", vocab " + std::to_string(vocab) + " (its float32 parameters)");
}

double GPTConfig::parameter_bytes() const {
    const double c = double(width), per_block = 12 * c * c + 13 * c;  // norms, qkv, proj, fc1, fc2 with biases
    return 4 * (double(layers) * per_block + 2 * double(vocab) * c + double(context) * c + 2 * c);
}

void check_fits_memory(double bytes, const std::string& what) {
    const double have = double(physical_memory_bytes());
    if (have <= 0 || bytes <= have) return;
    char msg[128];
    std::snprintf(msg, sizeof msg, " needs at least %.1f GiB, more than this machine's %.1f GiB of memory", bytes / 1073741824.0,
                  have / 1073741824.0);
    throw Error(what + msg);
}

std::map<std::string, std::string> GPTConfig::to_metadata() const {
    return {{"fp8kit.model", "gpt"},
            {"gpt.layers", std::to_string(layers)},
            {"gpt.width", std::to_string(width)},
            {"gpt.heads", std::to_string(heads)},
            {"gpt.context", std::to_string(context)},
            {"gpt.vocab", std::to_string(vocab)}};
}

GPTConfig GPTConfig::from_metadata(const std::map<std::string, std::string>& m) {
    auto get = [&](const std::string& key) -> int64_t {
        const auto it = m.find(key);
        if (it == m.end()) throw Error("fp8kit::gpt::GPTConfig: the metadata has no '" + key + "'");
        try {
            size_t used = 0;
            const long long v = std::stoll(it->second, &used);
            if (used != it->second.size()) throw std::invalid_argument("trailing");
            return v;
        } catch (const std::exception&) {
            throw Error("fp8kit::gpt::GPTConfig: metadata '" + key + "' is " + quote_printable(it->second) + ", not an integer");
        }
    };
    if (m.count("fp8kit.model") == 0 || m.at("fp8kit.model") != "gpt") throw Error("fp8kit::gpt: the file does not hold an fp8kit GPT (metadata fp8kit.model)");
    GPTConfig c{get("gpt.layers"), get("gpt.width"), get("gpt.heads"), get("gpt.context"), get("gpt.vocab")};
    c.validate();
    return c;
}

GPT::GPT(const GPTConfig& cfg, uint64_t seed) : cfg_(cfg) {
    cfg.validate();
    add_child("tok_embed", std::make_shared<Embedding>(cfg.vocab, cfg.width));
    add_child("pos_embed", std::make_shared<Embedding>(cfg.context, cfg.width));
    auto blocks = add_child("blocks", std::make_shared<ModuleList>());
    for (int64_t l = 0; l < cfg.layers; ++l) blocks->append(std::make_shared<Block>(cfg.width, cfg.heads));
    add_child("norm_f", std::make_shared<LayerNorm>(cfg.width));
    add_child("lm_head", std::make_shared<Linear>(cfg.width, cfg.vocab, false));
    Normal normal(seed);
    const float residual_std = 0.02f / std::sqrt(2.0f * float(cfg.layers));
    for (auto& [name, p] : named_parameters()) {
        if (p->value.dim() < 2) continue;  // biases zero, norm weights one
        const bool residual = name.ends_with("attn.proj.weight") || name.ends_with("mlp.fc2.weight");
        float* w = p->value.data<float>();
        for (int64_t i = 0; i < p->value.numel(); ++i) w[i] = normal(residual ? residual_std : 0.02f);
    }
}

Tensor GPT::forward(const Tensor& tokens) {
    if (tokens.dtype() != DType::i32 || tokens.dim() != 2 || tokens.size(1) < 1 || tokens.size(1) > cfg_.context)
        throw Error("fp8kit::gpt::GPT::forward: tokens are " + std::string(to_string(tokens.dtype())) + " " +
                    to_string(tokens.shape()) + ", expected i32 [B, T] with 1 <= T <= context " + std::to_string(cfg_.context));
    b_ = tokens.size(0);
    t_ = tokens.size(1);
    std::vector<int32_t> pos(static_cast<size_t>(t_));
    for (int64_t i = 0; i < t_; ++i) pos[size_t(i)] = int32_t(i);
    Tensor x = child<Embedding>(tok_i).forward(tokens);                                         // [B, T, C]
    const Tensor pe = child<Embedding>(pos_i).forward(Tensor::from(pos, {t_}).to(tokens.device()));  // [T, C]
    residual_forward(x, x, pe);  // pe added to every sequence
    const auto& blocks = child<ModuleList>(blocks_i);
    for (int64_t l = 0; l < cfg_.layers; ++l) x = blocks.at<Block>(size_t(l)).forward(x);
    return child<Linear>(lm_head_i).forward(child<LayerNorm>(norm_f_i).forward(x));  // [B, T, V]
}

float GPT::loss(const Tensor& tokens, const Tensor& targets) {
    if (targets.shape() != tokens.shape())
        throw Error("fp8kit::gpt::GPT::loss: targets " + to_string(targets.shape()) + " and tokens " + to_string(tokens.shape()) + " differ");
    return ce_.forward(forward(tokens), targets);
}

void GPT::backward() {
    Tensor d = ce_.backward().reshape({b_, t_, cfg_.vocab});
    d = child<LayerNorm>(norm_f_i).backward(child<Linear>(lm_head_i).backward(d));  // [B, T, C]
    const auto& blocks = child<ModuleList>(blocks_i);
    for (int64_t l = cfg_.layers - 1; l >= 0; --l) d = blocks.at<Block>(size_t(l)).backward(d);
    // The position embedding's gradient: d summed over the batch (the [B, T * C] rows, in order).
    const Tensor dpos = Tensor::zeros({t_, cfg_.width}, DType::f32, d.device());
    bias_backward(dpos.reshape({t_ * cfg_.width}), d.reshape({b_, t_ * cfg_.width}));
    child<Embedding>(tok_i).backward(d);
    child<Embedding>(pos_i).backward(dpos);
}

void GPT::zero_grad() {
    for (auto& [name, p] : named_parameters())
        if (p->grad.defined()) p->grad.fill_zero();
}

Device GPT::device() const {
    const nn::Parameter& p = *named_parameters().front().second;
    return p.value.defined() ? p.value.device() : p.stored ? p.stored->data.device() : Device::cpu;
}

size_t GPT::activation_bytes() const {
    size_t s = ce_.saved_bytes();
    for (auto& [name, m] : const_cast<GPT*>(this)->named_modules()) s += m->saved_bytes();
    return s;
}

size_t GPT::weight_bytes() const {
    size_t s = 0;
    for (const auto& [name, p] : named_parameters()) s += p->bytes();
    return s;
}

void save_model(const GPT& model, const std::string& path) { nn::save_parameters(model, path, model.config().to_metadata()); }

std::unique_ptr<GPT> load_model(const std::string& path) {
    const Checkpoint file(path);  // a file or a directory of shards; opening errors name the path
    GPTConfig config;
    try {
        config = GPTConfig::from_metadata(file.metadata());
    } catch (const Error& e) {
        throw Error("fp8kit::gpt::load_model: '" + path + "': " + e.what());
    }
    auto model = std::make_unique<GPT>(config, 0);
    nn::load_parameters(*model, file);
    return model;
}

}  // namespace fp8kit::gpt
