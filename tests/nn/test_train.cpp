// tests/nn/test_train.cpp: the training job on a tiny GPT and the built-in corpus, fast parts
// (label nn): one seed twice gives the same losses bit for bit; a saved model loads back with the
// same logits; bad input names what is wrong. The 200-step run per recipe: test_train_e2e.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "fp8kit/nn.hpp"

namespace fp8kit::nn {
namespace {

TrainConfig tiny(int64_t steps) {
    TrainConfig c;
    c.model = GPTConfig{2, 64, 4, 32, 256};
    c.batch = 8;
    c.steps = steps;
    c.seed = 7;
    return c;
}

TEST(Train, SameSeedSameLossesBitForBit) {
    // f32, and delayed scaling (its amax history is state carried from step to step).
    const TrainConfig c = tiny(8);
    for (const char* recipe : {"f32", "delayed"}) {
        SCOPED_TRACE(recipe);
        const TrainResult a = train_gpt(builtin_corpus(), c, recipe), b = train_gpt(builtin_corpus(), c, recipe);
        ASSERT_EQ(a.losses.size(), b.losses.size());
        for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(std::bit_cast<uint32_t>(a.losses[i]), std::bit_cast<uint32_t>(b.losses[i])) << i;
        EXPECT_EQ(std::bit_cast<uint32_t>(a.final_loss), std::bit_cast<uint32_t>(b.final_loss));
    }
}

TEST(Train, SavedModelLoadsWithTheSameLogits) {
    const TrainResult r = train_gpt(builtin_corpus(), tiny(3), "tensorwise");
    const std::string path = (std::filesystem::temp_directory_path() / "fp8kit_test_train_model.safetensors").string();
    save_model(*r.model, path);
    const auto m = load_model(path);
    std::filesystem::remove(path);
    const Tensor tokens = Tensor::from(std::vector<int32_t>{72, 101, 108, 108, 111}, {1, 5});
    // The loaded model is a plain GPT (float32 Linear), the trained one has Float8Linear: compare
    // against a fresh float32 GPT carrying the trained weights.
    GPT plain(r.model->config(), 0);
    const auto src = r.model->named_parameters();
    const auto dst = plain.named_parameters();
    ASSERT_EQ(src.size(), dst.size());
    for (size_t i = 0; i < src.size(); ++i) dst[i].second->value = src[i].second->value;
    const Tensor a = plain.forward(tokens), b = m->forward(tokens);
    ASSERT_EQ(a.numel(), b.numel());
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
    EXPECT_EQ(generate(*m, "The ", 20, 3), generate(*m, "The ", 20, 3));
    EXPECT_EQ(generate(*m, "The ", 20, 3).size(), 20u);
}

TEST(Train, BadInputNamesWhatIsWrong) {
    auto message = [](auto&& fn) {
        try {
            fn();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message([] { train_gpt(builtin_corpus(), tiny(1), "fp4"); }).find("unknown recipe 'fp4'"), std::string::npos);
    EXPECT_NE(message([] { train_gpt("too short", tiny(1), "f32"); }).find("the training text has 9 bytes"), std::string::npos);
    TrainConfig c = tiny(1);
    c.model.heads = 3;
    EXPECT_NE(message([&] { train_gpt(builtin_corpus(), c, "f32"); }).find("not a multiple of heads 3"), std::string::npos);
    EXPECT_NE(message([] { load_model("/nonexistent/model.safetensors"); }).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace fp8kit::nn
