// tests/nn/test_checkpoint.cpp: nn::save_model / nn::load_model over safetensors (label nn).
// A saved model reloads with bit-identical logits and every parameter under its qualified name as
// float32; each kind of bad file is refused with an fp8kit::Error naming the file and the
// problem (missing or invalid metadata, a missing tensor, a wrong shape or dtype, an extra tensor).
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "fp8kit/nn.hpp"
#include "fp8kit/safetensors.hpp"

namespace fp8kit::nn {
namespace {

namespace fs = std::filesystem;

const GPTConfig small{2, 32, 4, 16, 256};

std::string temp_file(const std::string& name) { return (fs::temp_directory_path() / ("fp8kit_test_ckpt_" + name)).string(); }

std::string message(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

// The model's parameters as (name, tensor), for writing variants of a good file.
std::vector<std::pair<std::string, Tensor>> tensors_of(const GPT& m) {
    std::vector<std::pair<std::string, Tensor>> t;
    for (const auto& [name, p] : m.named_parameters()) t.emplace_back(name, p->value);
    return t;
}

TEST(Checkpoint, SafetensorsRoundTripIsBitExact) {
    GPT model(small, 11);
    const std::string path = temp_file("roundtrip.safetensors");
    save_model(model, path);
    {
        // The file is plain safetensors: every parameter as F32 under its qualified name, the
        // config in the metadata.
        const SafetensorsFile f(path);
        EXPECT_EQ(f.metadata().at("gpt.width"), "32");
        ASSERT_TRUE(f.contains("blocks.0.attn.qkv.weight"));
        EXPECT_EQ(f.entry("blocks.0.attn.qkv.weight").dtype, DType::f32);
        EXPECT_EQ(f.entry("blocks.0.attn.qkv.weight").shape, (Shape{96, 32}));
        EXPECT_EQ(f.names().size(), model.named_parameters().size());
    }
    const auto loaded = load_model(path);
    fs::remove(path);
    EXPECT_EQ(loaded->config().layers, 2);
    const Tensor tokens = Tensor::from(std::vector<int32_t>{84, 104, 101, 32, 99, 97, 116}, {1, 7});
    const Tensor a = model.forward(tokens), b = loaded->forward(tokens);
    ASSERT_EQ(a.shape(), b.shape());
    for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(a.data<float>()[i]), std::bit_cast<uint32_t>(b.data<float>()[i])) << i;
    // The loaded parameters are writable copies (training can go on from them).
    loaded->named_parameters().front().second->value.data<float>()[0] = 1.0f;
}

TEST(Checkpoint, BadFilesNameTheFileAndTheProblem) {
    GPT model(small, 3);
    const std::string path = temp_file("bad.safetensors");
    const auto good = tensors_of(model);
    const auto meta = small.to_metadata();
    auto expect_error = [&](const std::vector<std::pair<std::string, Tensor>>& t, const std::map<std::string, std::string>& m,
                            const std::string& problem) {
        save_safetensors(path, t, m);
        const std::string msg = message([&] { load_model(path); });
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find(problem), std::string::npos) << msg;
    };
    {
        SCOPED_TRACE("the good file loads");
        save_safetensors(path, good, meta);
        EXPECT_EQ(message([&] { load_model(path); }), "no error");
    }
    {
        SCOPED_TRACE("missing tensor");
        auto t = good;
        t.erase(t.begin() + 3);
        expect_error(t, meta, "has no tensor '" + good[3].first + "'");
    }
    {
        SCOPED_TRACE("wrong shape");
        auto t = good;
        for (auto& [n, v] : t)
            if (n == "blocks.1.mlp.fc1.weight") v = Tensor::zeros({128, 16}, DType::f32);
        expect_error(t, meta, "'blocks.1.mlp.fc1.weight' is [128, 16], the model expects [128, 32]");
    }
    {
        SCOPED_TRACE("wrong dtype");
        auto t = good;
        for (auto& [n, v] : t)
            if (n == "norm_f.weight") v = Tensor::zeros({32}, DType::bf16);
        expect_error(t, meta, "'norm_f.weight' is BF16, expected F32");
    }
    {
        SCOPED_TRACE("extra tensor");
        auto t = good;
        t.emplace_back("blocks.9.attn.qkv.weight", Tensor::zeros({2, 2}, DType::f32));
        expect_error(t, meta, "unexpected tensor 'blocks.9.attn.qkv.weight'");
    }
    {
        SCOPED_TRACE("no metadata");
        expect_error(good, {}, "does not hold an fp8kit GPT");
    }
    {
        SCOPED_TRACE("metadata without a field");
        auto m = meta;
        m.erase("gpt.heads");
        expect_error(good, m, "no 'gpt.heads'");
    }
    {
        SCOPED_TRACE("metadata not an integer");
        auto m = meta;
        m["gpt.layers"] = "two";
        expect_error(good, m, "'gpt.layers' is 'two', not an integer");
    }
    {
        SCOPED_TRACE("metadata describing another model");
        auto m = meta;
        m["gpt.layers"] = "3";
        expect_error(good, m, "has no tensor 'blocks.2.");
    }
    {
        SCOPED_TRACE("not a safetensors file");
        {
            std::FILE* f = std::fopen(path.c_str(), "wb");
            ASSERT_NE(f, nullptr);
            std::fputs("FP8KNN01 not a safetensors header", f);
            std::fclose(f);
        }
        const std::string msg = message([&] { load_model(path); });
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
    }
    fs::remove(path);
    const std::string missing = temp_file("does_not_exist.safetensors");
    EXPECT_NE(message([&] { load_model(missing); }).find("cannot open '" + missing + "'"), std::string::npos);
}

}  // namespace
}  // namespace fp8kit::nn
