// tests/nn/test_train_e2e.cpp (label slow): the training job end to end on a tiny GPT
// (2 layers, width 64, context 32, batch 8) and the built-in corpus, 200 steps per recipe from the
// same initialisation and data order: every FP8 recipe's held-out loss within 3% of f32's, and
// the loss falls for every recipe.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "fp8kit/nn.hpp"

namespace fp8kit::nn {
namespace {

TrainConfig tiny() {
    TrainConfig c;
    c.model = GPTConfig{2, 64, 4, 32, 256};
    c.batch = 8;
    c.steps = 200;
    c.seed = 7;
    return c;
}

float mean(const std::vector<float>& v, size_t from, size_t to) {
    return std::accumulate(v.begin() + long(from), v.begin() + long(to), 0.0f) / float(to - from);
}

TEST(TrainE2E, EveryFp8RecipeWithin3PercentOfF32AndTheLossFalls) {
    const TrainConfig c = tiny();
    const TrainResult f32 = train_gpt(builtin_corpus(), c, "f32");
    for (const auto& recipe : training_recipes()) {
        SCOPED_TRACE(recipe);
        const TrainResult r = recipe == "f32" ? TrainResult{} : train_gpt(builtin_corpus(), c, recipe);
        const TrainResult& run = recipe == "f32" ? f32 : r;
        ASSERT_EQ(run.losses.size(), size_t(c.steps));
        // Falls: the last 20 steps' mean at least 1 nat below the first 20's (ln 256 = 5.55 at
        // step 0), and the held-out loss below 3 nats per byte.
        EXPECT_LT(mean(run.losses, 180, 200), mean(run.losses, 0, 20) - 1.0f);
        EXPECT_LT(run.final_loss, 3.0f);
        EXPECT_LE(std::abs(run.final_loss / f32.final_loss - 1.0f), 0.03f) << run.final_loss << " vs f32 " << f32.final_loss;
        RecordProperty(recipe, std::to_string(run.final_loss));
    }
}

}  // namespace
}  // namespace fp8kit::nn
