// tests/nn/test_train_e2e.cpp (label slow): the training job of the GPT app (tools/gpt/gpt.hpp) end
// to end on a tiny GPT (2 layers, width 64, context 32, batch 8) and the built-in corpus, 200 steps
// per recipe, over 3 seeds (each seed: one initialisation and data order, the same for every recipe
// of that seed) - not one chosen seed. Every recipe costs at most 1% on average: the mean of its
// held-out losses over the seeds no more than 1% above f32's mean; in the worst seed no more than
// 2% above f32's loss of that seed; the loss falls for every recipe and seed, and the held-out loss
// ends below a unigram model's. One-sided: a recipe ending below f32 is the trajectory's noise.
// Why 1% and 2%: at the training's peak lr (TrainConfig::lr) no run spikes, and the recipes of a
// seed stay together - measured, every FP8 recipe and bf16 within -0.05 ... +0.06% of f32 at every
// seed. A single seed's gap still moves with the rounding of the GEMMs' sums, which the kernels
// may order differently on another CPU (NUMERICS.md), hence the worst seed's wider margin. At the
// earlier peak of 3e-3 the loss spiked after the warmup and one seed's gap reached 12.8% by chance;
// these bounds would fail there, as they should: the table could not tell a cost from a spike. A
// recipe that is broken (a wrong scale or transpose) costs far more: its loss does not fall to
// the unigram model's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "gpt/gpt.hpp"

namespace fp8kit::gpt {
namespace {

constexpr uint64_t seeds[] = {1, 2, 3};

TrainConfig tiny(uint64_t seed) {
    TrainConfig c;
    c.model = GPTConfig{2, 64, 4, 32, 256};
    c.batch = 8;
    c.steps = 200;
    c.seed = seed;
    return c;
}

// The cross-entropy of the held-out tenth of the built-in corpus under the byte frequencies of the
// other nine tenths (add-1/2 smoothing): 3.25 nats. A model below it uses the context.
constexpr float unigram_loss = 3.25f;

float mean(const std::vector<float>& v, size_t from, size_t to) {
    return std::accumulate(v.begin() + long(from), v.begin() + long(to), 0.0f) / float(to - from);
}

TEST(TrainE2E, NoRecipeCostsMoreThan1PercentOverSeedsAndTheLossFalls) {
    std::vector<float> f32;  // per seed
    double f32_mean = 0;
    for (uint64_t seed : seeds) {
        f32.push_back(train_gpt(builtin_corpus(), tiny(seed), "f32").final_loss);
        EXPECT_LT(f32.back(), unigram_loss) << "f32, seed " << seed;
        f32_mean += double(f32.back()) / double(std::size(seeds));
    }
    for (const auto& recipe : training_recipes()) {
        if (recipe == "f32") continue;
        SCOPED_TRACE(recipe);
        double loss_mean = 0, worst = -1;  // worst: the largest gap above f32
        std::string gaps;
        for (size_t i = 0; i < std::size(seeds); ++i) {
            const TrainConfig c = tiny(seeds[i]);
            const TrainResult run = train_gpt(builtin_corpus(), c, recipe);
            ASSERT_EQ(run.losses.size(), size_t(c.steps));
            // Falls: the last 20 steps' mean at least 1 nat below the first 20's (ln 256 = 5.55 at
            // step 0), and the held-out loss below the unigram model's.
            EXPECT_LT(mean(run.losses, 180, 200), mean(run.losses, 0, 20) - 1.0f) << "seed " << seeds[i];
            EXPECT_LT(run.final_loss, unigram_loss) << "seed " << seeds[i];
            const double gap = double(run.final_loss) / double(f32[i]) - 1.0;
            loss_mean += double(run.final_loss) / double(std::size(seeds));
            worst = std::max(worst, gap);
            char buf[64];
            std::snprintf(buf, sizeof buf, "%s%+.2f%%", gaps.empty() ? "" : " ", 100 * gap);
            gaps += buf;
        }
        const double mean_gap = loss_mean / f32_mean - 1.0;
        std::printf("[ %-10s ] held-out gap to f32 per seed: %s; of the means %+.2f%%, worst %+.2f%%\n", recipe.c_str(), gaps.c_str(),
                    100 * mean_gap, 100 * worst);
        EXPECT_LE(mean_gap, 0.01) << "mean held-out loss over the seeds";
        EXPECT_LE(worst, 0.02) << "the worst seed";
    }
}

}  // namespace
}  // namespace fp8kit::gpt
