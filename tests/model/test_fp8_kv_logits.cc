// --kv-cache-dtype fp8 against the f32 KV cache on the CPU backend: the logits of every position
// of the golden prompts (tests/data) agree in argmax and stay close in distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

struct Fixture {
    const char* name;
    std::string model;   // what load_model opens
    std::string golden;  // folder with golden.json (the prompt)
};

std::vector<Fixture> fixtures() {
    return {
        {"stories260K", models_dir() + "/stories260K", models_dir() + "/stories260K"},
        {"llama3_tiny", data_dir() + "/llama3-tiny", data_dir() + "/llama3-tiny"},
        {"qwen2_tiny", data_dir() + "/qwen2-tiny", data_dir() + "/qwen2-tiny"},
        {"qwen3_tiny", data_dir() + "/qwen3-tiny", data_dir() + "/qwen3-tiny"},
    };
}

// The logits of every prompt position with an f32 and an FP8 cache, prompts run in chunks of 7
// so that later chunks read earlier ones back from the cache. The fixtures' random weights give
// many near-ties (top-two gaps under 0.01), which an FP8 cache's error (about 2^-4 of each K/V
// element) may flip: the argmax is held at every position whose top two are 0.05 apart, the mean
// KL everywhere, and the agreement over all positions is printed.
TEST(Fp8KvLogits, AgreesWithF32KvOnTheGoldenPrompts) {
    size_t rows = 0, mismatches = 0, decisive_rows = 0;
    double kl_sum = 0;
    for (const Fixture& f : fixtures()) {
        const auto golden = read_json_file(f.golden + "/golden.json");
        const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
        TestModel m(f.model);
        const std::vector<float> ref = m.all_logits(prompt, 7);
        m.backend->set_kv_cache_dtype(DType::F8_E4M3);
        const std::vector<float> fp8 = m.all_logits(prompt, 7);
        const LogitStats s = compare_logits(ref, fp8, m.vocab());
        const Decisive d = decisive(ref, fp8, m.vocab(), 0.05);
        std::printf(
            "%s: %zu positions, argmax agreement %.4f (%zu differ, reference top-two gap <= %.3g), mean KL %.3g, "
            "max |dlogit| %.3g; %zu positions with a gap >= 0.05, %zu of them differ\n",
            f.name, prompt.size(), s.argmax_agree, s.argmax_mismatches, d.worst_flip_gap, s.mean_kl, s.max_abs_diff,
            d.positions, d.flips);
        EXPECT_GT(s.max_abs_diff, 0.0) << f.name << ": the FP8 cache changed nothing (not in use?)";
        EXPECT_LE(s.mean_kl, 1e-3) << f.name;
        EXPECT_EQ(d.flips, 0u) << f.name << ": an argmax flipped where the reference's top two are 0.05 apart";
        rows += prompt.size();
        mismatches += s.argmax_mismatches;
        decisive_rows += d.positions;
        kl_sum += s.mean_kl * static_cast<double>(prompt.size());
    }
    std::printf("all: %zu positions, argmax agreement %.4f, mean KL %.3g; %zu positions with a gap >= 0.05\n", rows,
                1.0 - static_cast<double>(mismatches) / static_cast<double>(rows), kl_sum / static_cast<double>(rows),
                decisive_rows);
    EXPECT_GE(decisive_rows, rows / 2) << "too few decisive positions for the check to mean anything";
}

// stories260K is trained (the others are random): its first 48 greedy tokens are the f32 cache's
// (measured; longer continuations part at some later token).
TEST(Fp8KvLogits, StoriesGreedyContinuationIsTheF32Ones) {
    const auto golden = read_json_file(models_dir() + "/stories260K/golden.json");
    const std::vector<int32_t> prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    TestModel m(models_dir() + "/stories260K");
    const std::vector<int> ref = m.greedy(prompt, 48);
    m.backend->set_kv_cache_dtype(DType::F8_E4M3);
    EXPECT_EQ(m.greedy(prompt, 48), ref);
}

// Issue #23's ">= 99% argmax agreement against bf16 KV", on the one trained model here: stories
// sampled from the f32 model itself (temperature 1, 8 seeds, BOS + 255 tokens: the positions a
// user's text would visit), teacher-forced through the f32 and the FP8 cache in chunks of 16.
// Measured: 0.9536 (95 of 2,048 differ), mean KL 0.0119, not the 99%: stories260K's
// heads are 8 wide, so a score averages the E4M3 error (up to 2^-4 of each element) over 8
// products only (KL grows with the square of that error; 64- and 128-wide heads average it over
// 8-16x more). The bounds hold that level (a regression guard), the issue stays open on it.
TEST(Fp8KvLogits, TrainedModelAgreesOnSampledStories) {
    TestModel m(models_dir() + "/stories260K");
    const int vocab = m.vocab(), len = 256;
    size_t rows = 0, mismatches = 0;
    double kl_sum = 0;
    for (uint32_t seed = 1; seed <= 8; ++seed) {
        m.backend->set_kv_cache_dtype(DType::F32);
        std::mt19937 rng(seed);
        std::vector<int32_t> ids = {1};
        {
            SequenceRunner runner(*m.model, *m.backend, len);
            std::vector<float> logits;
            runner.run(ids, false, logits);
            while (static_cast<int>(ids.size()) < len) {
                const float mx = *std::max_element(logits.begin(), logits.begin() + vocab);
                std::vector<double> p(vocab);
                for (int v = 0; v < vocab; ++v) p[v] = std::exp(static_cast<double>(logits[v] - mx));
                const int next = std::discrete_distribution<int>(p.begin(), p.end())(rng);
                ids.push_back(next);
                if (static_cast<int>(ids.size()) < len) runner.run({next}, false, logits);
            }
        }
        const std::vector<float> ref = m.all_logits(ids, 16);
        m.backend->set_kv_cache_dtype(DType::F8_E4M3);
        const std::vector<float> fp8 = m.all_logits(ids, 16);
        const LogitStats s = compare_logits(ref, fp8, vocab);
        rows += ids.size();
        mismatches += s.argmax_mismatches;
        kl_sum += s.mean_kl * static_cast<double>(ids.size());
    }
    const double agree = 1.0 - static_cast<double>(mismatches) / static_cast<double>(rows);
    std::printf("stories260K, 8 sampled stories: %zu positions, argmax agreement %.4f (%zu differ), mean KL %.3g\n",
                rows, agree, mismatches, kl_sum / static_cast<double>(rows));
    EXPECT_GE(agree, 0.94);  // margin for other CPUs' kernels (the sampled tokens follow the f32 logits)
    EXPECT_LE(kl_sum / static_cast<double>(rows), 0.02);
}

// The same figure on the trained fixture (64-wide heads, the width of Llama 3.2 1B's; trained on
// text: tests/data/README.md) over its 8 held-out passages (2,048 positions), teacher-forced in
// chunks of 16 through the f32 and the FP8 cache. Measured (2-core AMD EPYC, AVX2): argmax
// agreement 0.9771 (47 differ, at reference top-two gaps up to 0.61), mean KL 2.74e-3: below the
// issue's 99%, and exactly what transformers gives with the same E4M3 round trip of its keys and
// values (scripts/fp8-reference.py: 0.9771, 2.74e-3; keys alone 0.9780, values alone 0.9912). So
// the cache is the format's, and its 3-bit mantissa on keys is what this model feels (the random
// fixtures above hide it behind their near-ties). The bounds hold that level.
TEST(Fp8KvLogits, TextTrainedModelAgreesOnHeldOutText) {
    TestModel m(data_dir() + "/text-trained");
    auto run = [&](DType cache) {
        return [&m, cache](const std::vector<int32_t>& ids) {
            m.backend->set_kv_cache_dtype(cache);
            return m.all_logits(ids, 16);
        };
    };
    const HeldOutAgreement h = text_trained_agreement(run(DType::F32), run(DType::F8_E4M3), m.vocab());
    ASSERT_EQ(h.positions, 2048u);
    EXPECT_GE(h.agree(), 0.97);
    EXPECT_LE(h.mean_kl, 3.5e-3);
}

}  // namespace
}  // namespace peregrine::testing
