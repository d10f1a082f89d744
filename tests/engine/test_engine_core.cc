// EngineCore with a fake model: block accounting invariants under random traffic, prefix
// caching, n > 1 sharing, preemption, seeds and the request checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/engine_core.h"
#include "support/block_invariants.h"
#include "support/fake_executor.h"

namespace peregrine::testing {
namespace {

// Runs until every request finished; returns token ids per (request id, choice).
std::map<std::pair<std::string, int>, std::vector<int32_t>> drain(EngineCore& core, bool check = false) {
    std::map<std::pair<std::string, int>, std::vector<int32_t>> out;
    for (int guard = 0; core.has_unfinished() && guard < 100000; ++guard) {
        for (const RequestOutput& o : core.step()) {
            auto& v = out[{o.request_id, o.index}];
            v.insert(v.end(), o.token_ids.begin(), o.token_ids.end());
        }
        if (check) check_invariants(core);
    }
    return out;
}

Request make_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens, float temperature = 0.0f) {
    Request r;
    r.id = id;
    r.prompt_ids = std::move(prompt);
    r.sampling.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.ignore_eos = true;
    return r;
}

std::vector<int32_t> alone(const Request& r, int num_blocks = 64, int block_size = 4) {
    FakeExecutor ex(num_blocks, block_size);
    EngineCore core({}, ex);
    core.add_request(r);
    return drain(core)[{r.id, 0}];
}

TEST(EngineCore, RandomTrafficKeepsBlockInvariants) {
    FakeExecutor ex(32, 4);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 24;
    cfg.scheduler.max_num_seqs = 8;
    EngineCore core(cfg, ex);
    std::mt19937 rng(1234);
    std::vector<std::vector<int32_t>> prefixes = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
                                                  {50, 51, 52, 53, 54, 55, 56, 57}};
    std::vector<std::string> live;
    int next_id = 0, ops = 0;
    for (; ops < 10000; ++ops) {
        const int dice = rng() % 10;
        if (dice < 3) {
            std::vector<int32_t> prompt;
            if (rng() % 2) prompt = prefixes[rng() % 2];
            const int extra = 1 + rng() % 20;
            for (int i = 0; i < extra; ++i) prompt.push_back(rng() % 97);
            Request r = make_request("r" + std::to_string(next_id++), prompt, 1 + rng() % 20, (rng() % 2) * 0.8f);
            r.sampling.n = 1 + rng() % 3;
            r.priority = rng() % 3;
            if (rng() % 4 == 0) r.cache_salt = "tenant" + std::to_string(rng() % 2);
            live.push_back(r.id);
            core.add_request(std::move(r));
        } else if (dice == 3 && !live.empty()) {
            const size_t k = rng() % live.size();
            core.abort_request(live[k]);
            live.erase(live.begin() + k);
        } else {
            for (const RequestOutput& o : core.step())
                if (o.usage) live.erase(std::remove(live.begin(), live.end(), o.request_id), live.end());
        }
        check_invariants(core);
        if (::testing::Test::HasFatalFailure()) break;
    }
    EXPECT_EQ(ops, 10000);
    drain(core, true);
    EXPECT_EQ(core.block_manager().num_used(), 0);
    EXPECT_EQ(core.block_manager().num_available(), 32);
    EXPECT_GT(core.stats().preemptions, 0u);
    EXPECT_GT(core.stats().prefix_hits, 0u);
    EXPECT_GT(core.stats().evictions, 0u);
    EXPECT_GT(ex.copies_, 0u) << "n > 1 never exercised copy-on-write";
}

TEST(EngineCore, BatchCompositionDoesNotChangeGreedyOutput) {
    std::mt19937 rng(7);
    std::vector<Request> reqs;
    for (int i = 0; i < 40; ++i) {
        std::vector<int32_t> prompt;
        const int len = 1 + rng() % 30;
        for (int j = 0; j < len; ++j) prompt.push_back(rng() % 97);
        reqs.push_back(make_request("q" + std::to_string(i), prompt, 1 + rng() % 25));
    }
    for (int budget : {512, 7}) {
        for (int blocks : {256, 24}) {  // 24 blocks of 4: preemption
            FakeExecutor ex(blocks, 4);
            CoreConfig cfg;
            cfg.scheduler.max_num_batched_tokens = budget;
            EngineCore core(cfg, ex);
            std::map<std::pair<std::string, int>, std::vector<int32_t>> got;
            size_t next = 0;
            while (next < reqs.size() || core.has_unfinished()) {
                for (int k = rng() % 3; k > 0 && next < reqs.size(); --k) core.add_request(reqs[next++]);
                for (const RequestOutput& o : core.step()) {
                    auto& v = got[{o.request_id, 0}];
                    v.insert(v.end(), o.token_ids.begin(), o.token_ids.end());
                }
                check_invariants(core);
            }
            for (const Request& r : reqs)
                EXPECT_EQ(got[std::make_pair(r.id, 0)], alone(r)) << r.id << " budget " << budget;
            if (blocks == 24) {
                EXPECT_GT(core.stats().preemptions, 0u);
            }
        }
    }
}

TEST(EngineCore, SharedPrefixIsCachedAndSaltIsolates) {
    FakeExecutor ex(128, 16);
    EngineCore core({}, ex);
    std::vector<int32_t> prefix;
    for (int i = 0; i < 100; ++i) prefix.push_back((i * 13) % 97);
    std::vector<int32_t> p1 = prefix, p2 = prefix;
    p1.push_back(5);
    p2.push_back(6);
    core.add_request(make_request("a", p1, 8));
    drain(core);
    core.add_request(make_request("b", p2, 8));
    std::vector<RequestOutput> last;
    std::vector<int32_t> toks;
    while (core.has_unfinished())
        for (auto& o : core.step()) {
            toks.insert(toks.end(), o.token_ids.begin(), o.token_ids.end());
            if (o.usage) last.push_back(o);
        }
    ASSERT_EQ(last.size(), 1u);
    EXPECT_GE(last[0].usage->cached_tokens, 96);
    EXPECT_EQ(toks, alone(make_request("b", p2, 8), 128, 16));
    Request salted = make_request("c", p2, 8);
    salted.cache_salt = "other-tenant";
    core.add_request(salted);
    std::optional<Usage> u;
    while (core.has_unfinished())
        for (auto& o : core.step())
            if (o.usage) u = o.usage;
    EXPECT_EQ(u->cached_tokens, 0);
}

TEST(EngineCore, NChoicesShareThePromptBlocks) {
    FakeExecutor ex(64, 4);
    EngineCore core({}, ex);
    Request r = make_request("n4", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 6, 1.0f);
    r.sampling.n = 4;
    r.sampling.seed = 3;
    core.add_request(r);
    const auto first = core.step();  // prefill + fork: every choice holds the 3 prompt blocks
    ASSERT_EQ(first.size(), 4u);
    auto live = core.live_sequences();
    ASSERT_EQ(live.size(), 4u);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(core.block_manager().ref_count(live[0]->block_table[i]), 4);
    check_invariants(core);
    const auto out = drain(core, true);
    EXPECT_EQ(out.size(), 4u);
    std::set<std::vector<int32_t>> distinct;
    for (const auto& [k, v] : out) {
        EXPECT_EQ(v.size(), 5u);  // after the first token of each
        distinct.insert(v);
    }
    EXPECT_GT(distinct.size(), 1u) << "seeded choices should differ";
    EXPECT_GT(ex.copies_, 0u);
    EXPECT_EQ(core.block_manager().num_used(), 0);
}

TEST(EngineCore, SeedReproducibleAloneAndInABatch) {
    auto seeded = [](const std::string& id, uint64_t seed) {
        Request r = make_request(id, {3, 1, 4, 1, 5, 9, 2, 6}, 20, 1.0f);
        r.sampling.seed = seed;
        r.sampling.top_p = 0.9f;
        return r;
    };
    const std::vector<int32_t> solo = alone(seeded("s", 42), 256, 4);
    FakeExecutor ex(256, 4);
    EngineCore core({}, ex);
    for (int i = 0; i < 31; ++i) core.add_request(seeded("other" + std::to_string(i), 1000 + i));
    core.add_request(seeded("s", 42));
    auto out = drain(core);
    EXPECT_EQ(out[std::make_pair(std::string("s"), 0)], solo);
    EXPECT_NE(out[std::make_pair(std::string("other0"), 0)], solo);
    EXPECT_NE(alone(seeded("s", 43), 256, 4), solo);
}

TEST(EngineCore, AbortFreesEverything) {
    FakeExecutor ex(64, 4);
    EngineCore core({}, ex);
    Request r = make_request("x", {1, 2, 3, 4, 5, 6, 7}, 50, 1.0f);
    r.sampling.n = 3;
    core.add_request(r);
    core.step();
    core.step();
    core.abort_request("x");
    auto outs = core.step();
    int aborted = 0;
    for (auto& o : outs) aborted += o.finish == FinishReason::Abort;
    EXPECT_EQ(aborted, 3);
    EXPECT_TRUE(outs.back().usage.has_value());
    EXPECT_FALSE(core.has_unfinished());
    EXPECT_EQ(core.block_manager().num_used(), 0);
}

TEST(EngineCore, RejectsBadRequests) {
    FakeExecutor ex(8, 4, 97, 64);
    EngineCore core({}, ex);
    auto bad = [&](auto edit) {
        Request r = make_request("bad", {1, 2, 3}, 4);
        edit(r);
        EXPECT_THROW(core.add_request(r), Error);
    };
    bad([](Request& r) { r.prompt_ids.clear(); });
    bad([](Request& r) { r.prompt_ids = {1, 500}; });
    bad([](Request& r) { r.prompt_ids.assign(40, 1); });  // KV holds 32 tokens
    bad([](Request& r) { r.sampling.max_tokens = 0; });
    bad([](Request& r) { r.sampling.temperature = -1; });
    bad([](Request& r) { r.sampling.top_p = 0; });
    bad([](Request& r) { r.sampling.n = 0; });
    bad([](Request& r) { r.sampling.logprobs = 21; });
    core.add_request(make_request("ok", {1, 2, 3}, 100));  // clamped to the room left
    auto out = drain(core);
    EXPECT_EQ(out[std::make_pair(std::string("ok"), 0)].size(), 29u);
    EXPECT_FALSE(core.has_unfinished());
}

}  // namespace
}  // namespace peregrine::testing
