// The engine on the real embedded model (f32): greedy output of every request is bitwise the
// same alone and in a continuously batched crowd, with chunked prefill, and under preemption.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine_core.h"
#include "support/engine_runs.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

struct Crowd {
    int budget;
    int num_blocks;
};

TEST(EngineBatching, CrowdMatchesAloneBitwise) {
    TestModel m(models_dir() + "/stories260K");
    const std::vector<Request> reqs = random_greedy_requests(64, 99);
    const TokensById solo = run_alone(m, reqs);
    for (const Request& r : reqs) ASSERT_EQ(static_cast<int>(solo.at(r.id).size()), r.sampling.max_tokens);
    // Also the plain one-sequence path agrees on one of them.
    EXPECT_EQ(m.greedy(reqs[0].prompt_ids, reqs[0].sampling.max_tokens),
              std::vector<int>(solo.at("r0").begin(), solo.at("r0").end()));

    for (const Crowd& c : {Crowd{2048, 512}, Crowd{32, 512}, Crowd{2048, 24}, Crowd{32, 24}}) {
        EngineStats st;
        const auto got = run_crowd(m, reqs, c.budget, c.num_blocks, 5, &st);
        for (const Request& r : reqs)
            EXPECT_EQ(got.at(r.id), solo.at(r.id)) << r.id << " budget " << c.budget << " blocks " << c.num_blocks;
        if (c.num_blocks == 24) {
            EXPECT_GT(st.preemptions, 0u) << "budget " << c.budget;
        } else {
            EXPECT_EQ(st.preemptions, 0u);
        }
    }
}

TEST(EngineBatching, SharedPrefixHitsAndSameOutput) {
    TestModel m(models_dir() + "/stories260K");
    std::mt19937 rng(3);
    std::vector<int32_t> prefix{1};
    for (int i = 1; i < 100; ++i) prefix.push_back(3 + rng() % 500);
    Request a, b;
    a.id = std::string(1, 'a');
    b.id = std::string(1, 'b');
    a.prompt_ids = b.prompt_ids = prefix;
    a.prompt_ids.push_back(300);
    b.prompt_ids.push_back(301);
    for (Request* r : {&a, &b}) {
        r->sampling.temperature = 0;
        r->sampling.max_tokens = 20;
        r->sampling.ignore_eos = true;
    }
    auto generate = [&](EngineCore& core, const Request& r) {
        core.add_request(r);
        std::vector<int32_t> toks;
        Usage u;
        while (core.has_unfinished())
            for (auto& o : core.step()) {
                toks.insert(toks.end(), o.token_ids.begin(), o.token_ids.end());
                if (o.usage) u = *o.usage;
            }
        return std::make_pair(toks, u);
    };
    auto ex_exec = LocalExecutor::over(*m.backend, *m.model, 64, 16);
    LocalExecutor& ex = *ex_exec;
    EngineCore core({}, ex);
    generate(core, a);
    const auto [toks_b, usage_b] = generate(core, b);
    EXPECT_GE(usage_b.cached_tokens, 96);
    auto ex2_exec = LocalExecutor::over(*m.backend, *m.model, 64, 16);
    LocalExecutor& ex2 = *ex2_exec;
    EngineCore fresh({}, ex2);
    EXPECT_EQ(generate(fresh, b).first, toks_b);
    Request c = b;
    c.id = std::string(1, 'c');
    c.cache_salt = "another tenant";
    const auto [toks_c, usage_c] = generate(core, c);
    EXPECT_EQ(usage_c.cached_tokens, 0);
    EXPECT_EQ(toks_c, toks_b);
}

}  // namespace
}  // namespace peregrine::testing
