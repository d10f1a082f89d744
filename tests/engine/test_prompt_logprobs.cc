// Prompt logprobs (SamplingParams::prompt_logprobs) on the real llama3-tiny fixture: each prompt
// token's logprob is the log-softmax of the previous position's logits, checked against the
// Hugging Face logits of the same prompt (golden logits.f32) and the CPU model's own all-rows
// logits; the same whether the prompt runs in one step or in chunks, with n > 1, after a
// prefix-cache hit would have been possible, and under preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/engine_core.h"
#include "support/golden_util.h"
#include "worker/local_executor.h"

namespace peregrine::testing {
namespace {

// [rows, vocab] logits -> log-softmax of each row (double, for a reference).
std::vector<double> log_softmax_rows(const std::vector<float>& logits, int vocab) {
    std::vector<double> out(logits.size());
    for (size_t r = 0; r * vocab < logits.size(); ++r) {
        const float* x = logits.data() + r * vocab;
        const double mx = *std::max_element(x, x + vocab);
        double z = 0;
        for (int i = 0; i < vocab; ++i) z += std::exp(x[i] - mx);
        for (int i = 0; i < vocab; ++i) out[r * vocab + i] = x[i] - mx - std::log(z);
    }
    return out;
}

struct Outcome {
    std::map<int, std::vector<TokenLogprob>> prompt_lps;  // by choice index (only 0 expected)
    std::map<int, int> outputs_with_prompt_lps;           // by choice index
    std::map<int, std::vector<int32_t>> tokens;           // by choice index
    Usage usage;
};

Outcome run_one(TestModel& m, const Request& r, int budget = 2048, int blocks = 64, const Request* before = nullptr) {
    auto ex = LocalExecutor::over(*m.backend, *m.model, blocks, 16);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = budget;
    EngineCore core(cfg, *ex);
    auto drain = [&](Outcome& out) {
        while (core.has_unfinished())
            for (RequestOutput& o : core.step()) {
                if (!o.prompt_logprobs.empty()) {
                    ++out.outputs_with_prompt_lps[o.index];
                    out.prompt_lps[o.index] = std::move(o.prompt_logprobs);
                }
                out.tokens[o.index].insert(out.tokens[o.index].end(), o.token_ids.begin(), o.token_ids.end());
                if (o.usage) out.usage = *o.usage;
            }
    };
    Outcome out;
    if (before) {
        core.add_request(*before);
        Outcome ignored;
        drain(ignored);
    }
    core.add_request(r);
    drain(out);
    EXPECT_EQ(core.block_manager().num_used(), 0);
    return out;
}

Request prompt_request(const std::vector<int32_t>& prompt, int k) {
    Request r;
    r.id = "p";
    r.prompt_ids = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 4;
    r.sampling.ignore_eos = true;
    r.sampling.prompt_logprobs = k;
    return r;
}

void expect_same(const std::vector<TokenLogprob>& a, const std::vector<TokenLogprob>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].token, b[i].token) << what << " at " << i;
        EXPECT_NEAR(a[i].logprob, b[i].logprob, 1e-5) << what << " at " << i;
        EXPECT_EQ(a[i].rank, b[i].rank) << what << " at " << i;
        ASSERT_EQ(a[i].top.size(), b[i].top.size()) << what << " at " << i;
        for (size_t k = 0; k < a[i].top.size(); ++k) {
            EXPECT_EQ(a[i].top[k].first, b[i].top[k].first) << what << " at " << i;
            EXPECT_NEAR(a[i].top[k].second, b[i].top[k].second, 1e-5) << what << " at " << i;
        }
    }
}

class PromptLogprobs : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto golden = read_json_file(data_dir() + "/llama3-tiny/golden.json");
        prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
        hf = log_softmax_rows(read_f32_file(data_dir() + "/llama3-tiny/logits.f32"), m.vocab());
        own = log_softmax_rows(m.all_logits(prompt), m.vocab());
    }
    TestModel m{data_dir() + "/llama3-tiny"};
    std::vector<int32_t> prompt;
    std::vector<double> hf, own;  // [prompt rows, vocab] reference log-softmax
};

constexpr int kTop = 5;

TEST_F(PromptLogprobs, EqualLogSoftmaxOfTheReferenceLogits) {
    ASSERT_EQ(hf.size(), prompt.size() * m.vocab());
    const Outcome got = run_one(m, prompt_request(prompt, kTop));
    ASSERT_EQ(got.outputs_with_prompt_lps.size(), 1u);
    EXPECT_EQ(got.outputs_with_prompt_lps.at(0), 1);
    const std::vector<TokenLogprob>& lps = got.prompt_lps.at(0);
    ASSERT_EQ(lps.size(), prompt.size() - 1);  // none for the first token
    const int V = m.vocab();
    for (size_t i = 0; i < lps.size(); ++i) {
        const size_t row = i;  // position i's row gives token i + 1
        const int32_t tok = prompt[i + 1];
        EXPECT_EQ(lps[i].token, tok);
        EXPECT_NEAR(lps[i].logprob, own[row * V + tok], 1e-4) << i;
        EXPECT_NEAR(lps[i].logprob, hf[row * V + tok], 2e-3) << i;
        // The rank: 1 + the tokens more likely (in the model's own logits; ties count).
        int above = 0;
        for (int v = 0; v < V; ++v) above += own[row * V + v] > own[row * V + tok] + 1e-5 ? 1 : 0;
        EXPECT_GE(lps[i].rank, above + 1) << i;
        int at_least = 0;
        for (int v = 0; v < V; ++v) at_least += own[row * V + v] >= own[row * V + tok] - 1e-5 ? 1 : 0;
        EXPECT_LE(lps[i].rank, at_least) << i;
        // The top k: the k largest of the row, most likely first.
        ASSERT_EQ(lps[i].top.size(), static_cast<size_t>(kTop));
        std::vector<double> sorted(own.begin() + row * V, own.begin() + (row + 1) * V);
        std::sort(sorted.rbegin(), sorted.rend());
        for (int k = 0; k < kTop; ++k) {
            const auto [id, lp] = lps[i].top[k];
            EXPECT_NEAR(lp, sorted[k], 1e-4) << i << " top " << k;
            EXPECT_NEAR(lp, own[row * V + id], 1e-4) << i << " top " << k;
        }
        if (lps[i].rank == 1) {
            EXPECT_NEAR(lps[i].top[0].second, lps[i].logprob, 1e-6) << i;
        }
    }
    EXPECT_EQ(got.tokens.at(0).size(), 4u);
    EXPECT_EQ(got.usage.prompt_tokens, static_cast<int>(prompt.size()));
}

// A step computes at most SchedulerConfig::max_prompt_logprob_rows rows of a prompt owing
// prompt logprobs (their logits are held on the host): the prompt runs in chunks of that many,
// with the same numbers as in one step.
TEST_F(PromptLogprobs, RowsPerStepAreCapped) {
    const Request plain = prompt_request(prompt, kTop);
    const Outcome whole = run_one(m, plain);
    auto ex = LocalExecutor::over(*m.backend, *m.model, 64, 16);
    CoreConfig cfg;
    cfg.scheduler.max_prompt_logprob_rows = 10;
    EngineCore core(cfg, *ex);
    core.add_request(plain);
    int steps = 0;
    std::vector<TokenLogprob> lps;
    while (lps.empty() && core.has_unfinished()) {
        ++steps;
        for (RequestOutput& o : core.step())
            if (!o.prompt_logprobs.empty()) lps = std::move(o.prompt_logprobs);
    }
    EXPECT_GE(steps, (static_cast<int>(prompt.size()) - 1 + 9) / 10) << "the prompt ran in fewer chunks than the cap";
    expect_same(lps, whole.prompt_lps.at(0), "capped");
    while (core.has_unfinished()) core.step();
}

TEST_F(PromptLogprobs, ChunkedPrefillNAndPrefixCacheGiveTheSame) {
    const Request plain = prompt_request(prompt, kTop);
    const Outcome whole = run_one(m, plain);
    // Chunks of 7 and 16 tokens: rows arrive over many steps.
    for (int budget : {7, 16}) {
        const Outcome chunked = run_one(m, plain, budget);
        expect_same(chunked.prompt_lps.at(0), whole.prompt_lps.at(0), "chunked");
        EXPECT_EQ(chunked.tokens, whole.tokens) << budget;
    }
    // n = 3: one list, on choice 0's first output; every choice generates.
    Request n3 = plain;
    n3.sampling.n = 3;
    const Outcome three = run_one(m, n3);
    ASSERT_EQ(three.outputs_with_prompt_lps.size(), 1u);
    EXPECT_EQ(three.outputs_with_prompt_lps.at(0), 1);
    expect_same(three.prompt_lps.at(0), whole.prompt_lps.at(0), "n 3");
    for (int c = 0; c < 3; ++c) EXPECT_EQ(three.tokens.at(c), whole.tokens.at(0)) << c;
    // The prompt's blocks are in the prefix cache from an earlier request: not reused (the rows
    // need their logits), so the logprobs are all there and the same.
    Request earlier = plain;
    earlier.id = "earlier";
    earlier.sampling.prompt_logprobs = -1;
    const Outcome cached = run_one(m, plain, 2048, 64, &earlier);
    EXPECT_EQ(cached.usage.cached_tokens, 0);
    expect_same(cached.prompt_lps.at(0), whole.prompt_lps.at(0), "after a cacheable request");
    // Without prompt logprobs the same request does hit the cache (the check above means something).
    Request again = earlier;
    again.id = "again";
    EXPECT_GT(run_one(m, again, 2048, 64, &earlier).usage.cached_tokens, 0);
}

TEST_F(PromptLogprobs, PreemptionReportsEachRowOnce) {
    // Three long prompts in a KV cache that holds about two: some are preempted (recomputed)
    // while their prompts run in chunks; each still reports each prompt row once, as alone.
    const Outcome alone = run_one(m, prompt_request(prompt, 2));
    auto ex = LocalExecutor::over(*m.backend, *m.model, 30, 16);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 48;
    EngineCore core(cfg, *ex);
    for (const char* id : {"a", "b", "c"}) {
        Request r = prompt_request(prompt, 2);
        r.id = id;
        r.sampling.max_tokens = 40;
        core.add_request(r);
    }
    std::map<std::string, std::vector<TokenLogprob>> got;
    std::map<std::string, int> lists;
    while (core.has_unfinished())
        for (RequestOutput& o : core.step())
            if (!o.prompt_logprobs.empty()) {
                ++lists[o.request_id];
                got[o.request_id] = std::move(o.prompt_logprobs);
            }
    EXPECT_GT(core.stats().preemptions, 0u);
    for (const char* id : {"a", "b", "c"}) {
        EXPECT_EQ(lists[id], 1) << id;
        expect_same(got[id], alone.prompt_lps.at(0), id);
    }
}

TEST(PromptLogprobsChecks, OutOfRangeIsRefused) {
    SamplingParams p;
    p.prompt_logprobs = kMaxLogprobs + 1;
    const std::vector<FieldError> e = validate(p, {});
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(e[0].field, "prompt_logprobs");
    p.prompt_logprobs = -2;
    EXPECT_EQ(validate(p, {}).size(), 1u);
    p.prompt_logprobs = kMaxLogprobs;
    EXPECT_TRUE(validate(p, {}).empty());
}

}  // namespace
}  // namespace peregrine::testing
