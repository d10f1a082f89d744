// The host tier through the whole engine: a device pool that holds barely one sequence forces
// every shared prefix through host memory and back. Greedy outputs must be the same as with a
// large pool and as with no tier (fake model: a stale or misplaced block changes the logits;
// then the real embedded model, bitwise), host hits count as cached tokens, and the block
// invariants hold after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "core/error.h"
#include "engine/engine_core.h"
#include "support/block_invariants.h"
#include "support/engine_runs.h"
#include "support/fake_executor.h"
#include "support/golden_util.h"
#include "support/greedy_request.h"

namespace peregrine::testing {
namespace {

using Outputs = std::map<std::string, std::vector<int32_t>>;

// Three 16-token system prompts, each with four user suffixes; the whole set twice (second
// round: new ids, same prompts), a few requests arriving before each step.
std::vector<Request> shared_prefix_requests(int vocab) {
    std::mt19937 rng(11);
    std::vector<Request> out;
    std::vector<std::vector<int32_t>> systems(3);
    for (auto& s : systems)
        for (int i = 0; i < 16; ++i) s.push_back(1 + rng() % (vocab - 1));
    for (int round = 0; round < 2; ++round) {
        std::mt19937 srng(5);  // the same suffixes in both rounds
        for (int k = 0; k < 12; ++k) {
            std::vector<int32_t> prompt = systems[k % 3];
            for (int i = 0, n = 3 + srng() % 6; i < n; ++i) prompt.push_back(1 + srng() % (vocab - 1));
            out.push_back(greedy_request("r" + std::to_string(round) + "_" + std::to_string(k), std::move(prompt), 6));
        }
    }
    return out;
}

struct FakeRun {
    Outputs out;
    EngineStats stats;
    std::map<std::string, int> cached;  // cached tokens per request
};

FakeRun run_fake(int blocks, int host_slots, bool device_sampling = false, bool drop_onloads = false,
                 EvictionPolicy eviction = EvictionPolicy::Lru) {
    FakeExecutor ex(blocks, 4);
    if (host_slots > 0) ex.enable_host_tier(host_slots);
    if (device_sampling) ex.enable_device_sampling(64);
    ex.drop_onloads_ = drop_onloads;
    CoreConfig cfg;
    cfg.eviction = eviction;
    cfg.scheduler.max_num_batched_tokens = 64;
    EngineCore core(cfg, ex);
    const std::vector<Request> reqs = shared_prefix_requests(ex.vocab_size());
    std::mt19937 rng(7);
    FakeRun run;
    size_t next = 0;
    for (int guard = 0; (next < reqs.size() || core.has_unfinished()) && guard < 100000; ++guard) {
        for (int k = rng() % 3; k > 0 && next < reqs.size(); --k) core.add_request(reqs[next++]);
        const size_t steps_before = ex.steps_, off_before = ex.offload_calls_, on_before = ex.onload_calls_;
        for (const RequestOutput& o : core.step()) {
            auto& v = run.out[o.request_id];
            v.insert(v.end(), o.token_ids.begin(), o.token_ids.end());
            if (o.usage) run.cached[o.request_id] = o.usage->cached_tokens;
        }
        // One copy call each way per step at most.
        EXPECT_LE(ex.offload_calls_ - off_before, std::max<size_t>(1, ex.steps_ - steps_before));
        EXPECT_LE(ex.onload_calls_ - on_before, std::max<size_t>(1, ex.steps_ - steps_before));
        check_invariants(core);
    }
    EXPECT_EQ(core.block_manager().num_used(), 0);
    run.stats = core.stats();
    EXPECT_EQ(run.stats.kv_offloaded_blocks, ex.offloaded_);
    EXPECT_EQ(run.stats.kv_onloaded_blocks, ex.onloaded_);
    return run;
}

TEST(EngineHostTier, TinyPoolThroughTheHostTierMatchesALargePool) {
    const FakeRun large = run_fake(256, 0);
    const FakeRun none = run_fake(12, 0);  // 12 blocks of 4: one 24-token prompt + output, barely
    for (const bool device_sampling : {false, true}) {
        for (const int slots : {64, 5}) {  // room for every prefix; constant host eviction
            for (EvictionPolicy p : {EvictionPolicy::Lru, EvictionPolicy::Lfu, EvictionPolicy::Fifo}) {
                const FakeRun tier = run_fake(12, slots, device_sampling, false, p);
                EXPECT_EQ(tier.out, large.out) << "slots " << slots << " device " << device_sampling;
                EXPECT_EQ(tier.out, none.out);
                EXPECT_GT(tier.stats.kv_offloaded_blocks, 0u);
                EXPECT_GT(tier.stats.kv_onloaded_blocks, 0u);
                EXPECT_GT(tier.stats.host_prefix_hits, 0u);
                EXPECT_LE(tier.stats.host_prefix_hits, tier.stats.host_prefix_queries);
                EXPECT_GT(tier.stats.prefix_hits, none.stats.prefix_hits);
                EXPECT_EQ(tier.stats.num_host_kv_blocks, slots);
                if (slots == 5) {
                    EXPECT_GT(tier.stats.host_evictions, 0u);
                }
            }
        }
    }
    EXPECT_EQ(none.stats.kv_offloaded_blocks, 0u);
}

TEST(EngineHostTier, ABrokenOnloadIsNoticed) {
    // The test above would see a tier that copies nothing back: outputs differ.
    const FakeRun good = run_fake(12, 64);
    const FakeRun broken = run_fake(12, 64, false, true);
    EXPECT_NE(good.out, broken.out);
}

TEST(EngineHostTier, HostHitsCountAsCachedTokens) {
    // Prompt P, then enough other prompts to push P's blocks out of the device pool, then P again.
    for (const int slots : {0, 64}) {
        FakeExecutor ex(12, 4);
        if (slots) ex.enable_host_tier(slots);
        EngineCore core({}, ex);
        auto run = [&](const std::string& id, std::vector<int32_t> prompt) {
            Request r;
            r.id = id;
            r.prompt_ids = std::move(prompt);
            r.sampling.temperature = 0;
            r.sampling.max_tokens = 4;
            r.sampling.ignore_eos = true;
            core.add_request(r);
            Usage u;
            std::vector<int32_t> toks;
            while (core.has_unfinished())
                for (const RequestOutput& o : core.step()) {
                    toks.insert(toks.end(), o.token_ids.begin(), o.token_ids.end());
                    if (o.usage) u = *o.usage;
                }
            return std::make_pair(u, toks);
        };
        std::vector<int32_t> p(21);
        for (int i = 0; i < 21; ++i) p[i] = 1 + i;
        const auto first = run("p0", p);
        for (int k = 0; k < 3; ++k) {
            std::vector<int32_t> q(21);
            for (int i = 0; i < 21; ++i) q[i] = 30 + 21 * k + i;
            run("q" + std::to_string(k), q);
        }
        const auto again = run("p1", p);
        EXPECT_EQ(again.second, first.second);
        if (slots) {
            EXPECT_EQ(again.first.cached_tokens, 20) << "5 full blocks of the 21-token prompt";
            EXPECT_EQ(core.stats().host_prefix_hits, 20u);
        } else {
            EXPECT_EQ(again.first.cached_tokens, 0);
        }
    }
}

// The real embedded model on the CPU backend: bitwise the same greedy tokens.
TokensById run_model(TestModel& m, const std::vector<Request>& reqs, int blocks, int64_t host_bytes,
                     EngineStats* stats) {
    auto ex = LocalExecutor::over(*m.backend, *m.model, blocks, 16, nullptr, host_bytes);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 256;
    cfg.eos_token_ids = m.loaded->config.eos_token_ids;
    EngineCore core(cfg, *ex);
    std::mt19937 rng(3);
    TokensById got;
    size_t next = 0;
    while (next < reqs.size() || core.has_unfinished()) {
        for (int k = rng() % 3; k > 0 && next < reqs.size(); --k) core.add_request(reqs[next++]);
        for (const RequestOutput& o : core.step())
            got[o.request_id].insert(got[o.request_id].end(), o.token_ids.begin(), o.token_ids.end());
        check_invariants(core);
    }
    EXPECT_EQ(core.block_manager().num_used(), 0);
    *stats = core.stats();
    return got;
}

TEST(EngineHostTier, RealModelBitwiseWithATinyPool) {
    TestModel m(models_dir() + "/stories260K");
    const std::vector<Request> reqs = shared_system_requests(21, 2, 64, 5);
    const size_t block_bytes = m.model->kv_cache_shape(1, 16).bytes_per_block();
    EngineStats large_st, none_st, tier_st;
    const TokensById large = run_model(m, reqs, 256, 0, &large_st);
    const TokensById none = run_model(m, reqs, 7, 0, &none_st);  // 7 blocks of 16: one 80-token sequence
    const TokensById tier = run_model(m, reqs, 7, static_cast<int64_t>(32 * block_bytes), &tier_st);
    EXPECT_EQ(tier, large);
    EXPECT_EQ(none, large);
    EXPECT_EQ(tier_st.num_host_kv_blocks, 32);
    EXPECT_GT(tier_st.kv_onloaded_blocks, 0u);
    EXPECT_GT(tier_st.host_prefix_hits, 0u);
    EXPECT_GT(tier_st.prefix_hits, none_st.prefix_hits);
    EXPECT_EQ(tier_st.kv_block_bytes, block_bytes);
}

TEST(EngineHostTier, RejectsBadSizes) {
    TestModel m(models_dir() + "/stories260K");
    EXPECT_THROW(LocalExecutor::over(*m.backend, *m.model, 8, 16, nullptr, -1), Error);
    EXPECT_THROW(LocalExecutor::over(*m.backend, *m.model, 8, 16, nullptr, 100), Error);  // < one block
    EngineConfig c;
    c.kv_offload_memory = -5;
    EXPECT_THROW(c.validate(), Error);
    c.kv_offload_memory = int64_t{1} << 62;  // more than any host has
    EXPECT_THROW(c.validate(), Error);
    c.kv_offload_memory = 1 << 20;
    c.validate();
    c.prefix_caching = false;
    EXPECT_THROW(c.validate(), Error);
}

}  // namespace
}  // namespace peregrine::testing
