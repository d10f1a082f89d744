// The sampler's parameters one by one, on hand-made logits.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <utility>

#include "backend/sampling_row.h"
#include "engine/sampler.h"

namespace peregrine {
namespace {

// A sequence and its request's parameters; row() is its next draw as the samplers take it.
struct Fixture {
    SamplingParams params;
    Sequence seq;
    Fixture() {
        seq.sampling = &params;
        seq.tokens = {5, 6, 7};
        seq.num_prompt_tokens = 3;
        seq.rng.seed(1);
    }
    SampleRow row() { return sample_row(seq, 0, params.logprobs >= 0); }
};

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, -1.0f, 2.9f, 0.0f, 0.0f};

TEST(Sampler, GreedyTakesTheFirstMaximum) {
    Fixture f;
    f.params.temperature = 0;
    Sampler s({});
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), nullptr), 1);
    const std::vector<float> tie = {0, 4, 4, 1};
    EXPECT_EQ(s.sample(tie.data(), 4, f.row(), nullptr), 1);
}

// The greedy rule (backend/sampling_row.h), shared with the GPU sampler: temperatures below
// 1e-5 and top_k 1 take the argmax (the first of equal maxima) and leave the RNG alone; 1e-5
// itself draws. tests/cuda/test_sampling.cc checks the GPU against this on the same rows.
TEST(Sampler, GreedyBelowTheEpsilonAndAtTopK1) {
    EXPECT_TRUE(is_greedy(0.0f, 0));
    EXPECT_TRUE(is_greedy(1e-6f, 0));
    EXPECT_TRUE(is_greedy(-1.0f, 0));
    EXPECT_TRUE(is_greedy(std::nanf(""), 0));
    EXPECT_TRUE(is_greedy(1.0f, 1));
    EXPECT_FALSE(is_greedy(1e-5f, 0));
    EXPECT_FALSE(is_greedy(1.0f, 0));
    EXPECT_FALSE(is_greedy(1.0f, 2));

    const std::vector<float> tie = {0.5f, 2.0f, 2.0f, -1.0f};  // 1 and 2 equally likely
    Sampler s({});
    for (auto [t, k] : {std::pair{0.0f, 0}, {1e-6f, 0}, {1.0f, 1}}) {
        Fixture f;
        f.params.temperature = t;
        f.params.top_k = k;
        const std::mt19937_64 before = f.seq.rng;
        for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(tie.data(), 4, f.row(), nullptr), 1) << t << " " << k;
        EXPECT_TRUE(f.seq.rng == before) << "a greedy draw took a random value";
    }
    Fixture f;
    f.params.temperature = 1e-5f;
    std::map<int, int> h;
    for (int i = 0; i < 200; ++i) ++h[s.sample(tie.data(), 4, f.row(), nullptr)];
    EXPECT_EQ(h.size(), 2u);  // a draw between the two maxima
    EXPECT_GT(h[2], 50);
}

TEST(Sampler, LogitBiasAndMinTokensMasking) {
    Fixture f;
    f.params.temperature = 0;
    f.params.logit_bias = {{4, 10.0f}};
    Sampler s({4});  // 4 is EOS
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), nullptr), 4);
    f.params.min_tokens = 1;  // EOS masked while no output token exists
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), nullptr), 1);
    f.params.stop_token_ids = {1};
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), nullptr), 5);
}

TEST(Sampler, Penalties) {
    Fixture f;
    f.params.temperature = 0;
    f.seq.tokens = {5, 1, 1};  // prompt 5; output 1, 1
    f.seq.num_prompt_tokens = 1;
    Sampler s({});
    f.params.frequency_penalty = 0.06f;  // 3.0 - 0.12 = 2.88 < 2.9 (token 5)
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), nullptr), 5);
    f.params.frequency_penalty = 0;
    f.params.presence_penalty = 0.05f;  // 2.95 > 2.9
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), nullptr), 1);
    f.params.presence_penalty = 0;
    f.params.repetition_penalty = 2.0f;  // 1 → 1.5 and 5 (prompt) → 1.45: 2 wins with 2.0
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), nullptr), 2);
}

TEST(Sampler, TopKTopPMinPRestrictTheCandidates) {
    Sampler s({});
    auto histogram = [&](auto edit) {
        Fixture f;
        f.params.temperature = 1.0f;
        edit(f.params);
        std::map<int, int> h;
        for (int i = 0; i < 4000; ++i) ++h[s.sample(kLogits.data(), 8, f.row(), nullptr)];
        return h;
    };
    auto k2 = histogram([](SamplingParams& p) { p.top_k = 2; });
    EXPECT_EQ(k2.size(), 2u);
    EXPECT_TRUE(k2.count(1) && k2.count(5));
    // p(1) ~ 0.36, p(5) ~ 0.33, p(2) ~ 0.13: top_p 0.6 keeps exactly {1, 5}.
    auto p6 = histogram([](SamplingParams& p) { p.top_p = 0.6f; });
    EXPECT_EQ(p6.size(), 2u);
    auto minp = histogram([](SamplingParams& p) { p.min_p = 0.3f; });  // keeps p >= 0.3 p_max: 1, 5, 2
    EXPECT_EQ(minp.size(), 3u);
    auto all = histogram([](SamplingParams&) {});
    EXPECT_EQ(all.size(), 8u);
    // Frequencies follow softmax: token 1 about e^3 / sum.
    double z = 0;
    for (float l : kLogits) z += std::exp(l);
    EXPECT_NEAR(all[1] / 4000.0, std::exp(3.0) / z, 0.03);
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
    Fixture f;
    f.params.temperature = 0;
    f.params.logprobs = 3;
    f.params.logit_bias = {{0, 100.0f}};  // changes the choice, not the reported distribution
    Sampler s({});
    TokenLogprob lp;
    EXPECT_EQ(s.sample(kLogits.data(), 8, f.row(), &lp), 0);
    double z = 0;
    for (float l : kLogits) z += std::exp(l);
    EXPECT_EQ(lp.token, 0);
    EXPECT_NEAR(lp.logprob, 1.0 - std::log(z), 1e-5);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, 1);
    EXPECT_EQ(lp.top[1].first, 5);
    EXPECT_EQ(lp.top[2].first, 2);
    EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-5);
}

TEST(Sampler, SameSeedSameDraws) {
    Sampler s({});
    auto draws = [&](uint64_t seed) {
        Fixture f;
        f.params.temperature = 1.0f;
        f.seq.rng.seed(seed);
        std::vector<int> out;
        for (int i = 0; i < 50; ++i) out.push_back(s.sample(kLogits.data(), 8, f.row(), nullptr));
        return out;
    };
    EXPECT_EQ(draws(9), draws(9));
    EXPECT_NE(draws(9), draws(10));
}

}  // namespace
}  // namespace peregrine
