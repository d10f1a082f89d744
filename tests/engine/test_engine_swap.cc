// Swap preemption through the whole engine: a KV pool too small for the crowd forces
// preemptions; swapping the victims' blocks to the host tier must give the same greedy tokens as
// recomputing them (fake model: a block copied back wrong, or a stale one, changes the logits;
// then the real embedded model, bitwise) while fewer tokens go through the model.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>

#include "engine/engine_core.h"
#include "engine/engine_loop.h"
#include "support/block_invariants.h"
#include "support/engine_runs.h"
#include "support/fake_executor.h"
#include "support/golden_util.h"
#include "support/greedy_request.h"

namespace peregrine::testing {
namespace {

// Six requests with distinct 10-token prompts and 24 tokens each to write: in 12 blocks of 4
// three of them outgrow the pool together, so running ones are preempted again and again.
std::vector<Request> crowd(int vocab, int n = 6) {
    std::mt19937 rng(17);
    std::vector<Request> out;
    for (int k = 0; k < n; ++k) {
        std::vector<int32_t> prompt;
        for (int i = 0; i < 10; ++i) prompt.push_back(1 + rng() % (vocab - 1));
        out.push_back(greedy_request("s" + std::to_string(k), std::move(prompt), 24));
    }
    return out;
}

struct SwapRun {
    TokensById out;
    EngineStats stats;
    size_t model_tokens = 0;  // tokens run through the model
    int max_reserved = 0;     // host slots held by swapped-out sequences at most
};

SwapRun run_swap(bool swap, int host_slots, bool device_sampling = false, int blocks = 12, bool drop_onloads = false) {
    FakeExecutor ex(blocks, 4);
    ex.drop_onloads_ = drop_onloads;
    if (host_slots > 0) ex.enable_host_tier(host_slots);
    if (device_sampling) ex.enable_device_sampling(64);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 64;
    cfg.scheduler.swap_preemption = swap;
    EngineCore core(cfg, ex);
    SwapRun run;
    for (const Request& r : crowd(ex.vocab_size())) core.add_request(r);
    for (int guard = 0; core.has_unfinished() && guard < 100000; ++guard) {
        for (const RequestOutput& o : core.step())
            run.out[o.request_id].insert(run.out[o.request_id].end(), o.token_ids.begin(), o.token_ids.end());
        check_invariants(core);
        if (const HostBlockPool* h = core.block_manager().host())
            run.max_reserved = std::max(run.max_reserved, h->num_reserved());
    }
    EXPECT_EQ(core.block_manager().num_used(), 0);
    if (const HostBlockPool* h = core.block_manager().host()) {
        EXPECT_EQ(h->num_reserved(), 0) << "every swap slot is released";
    }
    run.stats = core.stats();
    run.model_tokens = ex.tokens_;
    EXPECT_EQ(run.stats.kv_offloaded_blocks, ex.offloaded_);
    EXPECT_EQ(run.stats.kv_onloaded_blocks, ex.onloaded_);
    return run;
}

TEST(EngineSwap, SwapGivesTheTokensOfRecomputeWithLessModelWork) {
    const SwapRun large = run_swap(false, 0, false, 256);
    for (const bool device_sampling : {false, true}) {
        const SwapRun bare = run_swap(false, 0, device_sampling);  // recompute, no host tier
        const SwapRun recompute = run_swap(false, 64, device_sampling);
        const SwapRun swap = run_swap(true, 64, device_sampling);
        EXPECT_EQ(bare.out, large.out);
        EXPECT_EQ(recompute.out, large.out);
        EXPECT_EQ(swap.out, large.out) << "device sampling " << device_sampling;
        EXPECT_GT(recompute.stats.preemptions, 0u);
        EXPECT_EQ(recompute.stats.swap_preemptions, 0u);
        EXPECT_GT(swap.stats.preemptions, 0u);
        EXPECT_EQ(swap.stats.swap_preemptions, swap.stats.preemptions) << "64 slots: room for every swap";
        EXPECT_GT(swap.stats.kv_swapped_out_blocks, 0u);
        EXPECT_EQ(swap.stats.kv_swapped_in_blocks, swap.stats.kv_swapped_out_blocks);
        EXPECT_GT(swap.max_reserved, 0);
        // Recompute with a host tier finds the victims' full blocks there: only partial blocks rerun.
        EXPECT_LT(swap.model_tokens, recompute.model_tokens);
        EXPECT_LT(swap.model_tokens, bare.model_tokens);
        // Without preemption every token runs once: prompts, then all but the last output token.
        EXPECT_EQ(large.model_tokens, 6u * (10 + 23));
        EXPECT_EQ(swap.model_tokens, large.model_tokens) << "a swapped sequence recomputes nothing";
        std::printf(
            "device sampling %d: model tokens %zu (recompute, no tier), %zu (recompute, tier), %zu (swap); "
            "preemptions %llu / %llu; blocks swapped out %llu\n",
            device_sampling, bare.model_tokens, recompute.model_tokens, swap.model_tokens,
            static_cast<unsigned long long>(recompute.stats.preemptions),
            static_cast<unsigned long long>(swap.stats.preemptions),
            static_cast<unsigned long long>(swap.stats.kv_swapped_out_blocks));
    }
}

TEST(EngineSwap, ABrokenSwapInIsNoticed) {
    // The fake model's logits read every cached token: blocks not copied back change them.
    const SwapRun large = run_swap(false, 0, false, 256);
    const SwapRun broken = run_swap(true, 64, false, 12, /*drop_onloads=*/true);
    EXPECT_GT(broken.stats.swap_preemptions, 0u);
    EXPECT_NE(broken.out, large.out);
}

TEST(EngineSwap, TooFewHostSlotsRecomputeInstead) {
    // 2 host slots: a victim with more computed blocks than that is recomputed, not swapped.
    const SwapRun large = run_swap(false, 0, false, 256);
    const SwapRun swap = run_swap(true, 2);
    EXPECT_EQ(swap.out, large.out);
    EXPECT_GT(swap.stats.preemptions, swap.stats.swap_preemptions);
    EXPECT_LE(swap.max_reserved, 2);
}

TEST(EngineSwap, AnAbortedSwappedSequenceFreesItsSlots) {
    FakeExecutor ex(12, 4);
    ex.enable_host_tier(64);
    CoreConfig cfg;
    cfg.scheduler.swap_preemption = true;
    EngineCore core(cfg, ex);
    for (const Request& r : crowd(ex.vocab_size())) core.add_request(r);
    int guard = 0;
    while (core.stats().swap_preemptions == 0 && guard++ < 1000) core.step();
    ASSERT_GT(core.block_manager().host()->num_reserved(), 0);
    for (int k = 0; k < 6; ++k) core.abort_request("s" + std::to_string(k));
    core.step();
    EXPECT_FALSE(core.has_unfinished());
    EXPECT_EQ(core.block_manager().host()->num_reserved(), 0);
    EXPECT_EQ(core.block_manager().num_used(), 0);
}

TEST(EngineSwap, ModeFollowsTheHostTier) {
    EngineConfig c;
    EXPECT_FALSE(core_config(c, {}).scheduler.swap_preemption);
    c.kv_offload_memory = 1 << 20;
    EXPECT_TRUE(core_config(c, {}).scheduler.swap_preemption);
    c.preemption_mode = "recompute";
    EXPECT_FALSE(core_config(c, {}).scheduler.swap_preemption);
    c.validate();
    c.preemption_mode = "swap";
    c.validate();
    c.preemption_mode = "sideways";
    EXPECT_THROW(c.validate(), Error);
    c.preemption_mode = "swap";
    c.kv_offload_memory = 0;
    EXPECT_THROW(c.validate(), Error) << "swap needs a host tier";
}

// The real embedded model on the CPU backend: 5 blocks of 16 for 4 sequences of up to 60 tokens.
TEST(EngineSwap, RealModelBitwiseUnderPreemption) {
    TestModel m(models_dir() + "/stories260K");
    std::vector<Request> reqs;
    for (int k = 0; k < 4; ++k) {
        std::vector<int32_t> prompt{1};
        for (int i = 0; i < 20 + 3 * k; ++i) prompt.push_back(3 + (k * 53 + i * 17) % 500);
        reqs.push_back(greedy_request("m" + std::to_string(k), std::move(prompt), 32));
    }
    const size_t block_bytes = m.model->kv_cache_shape(1, 16).bytes_per_block();
    auto run = [&](int blocks, int64_t host_bytes, bool swap, EngineStats* st) {
        auto ex = LocalExecutor::over(*m.backend, *m.model, blocks, 16, nullptr, host_bytes);
        CoreConfig cfg;
        cfg.scheduler.max_num_batched_tokens = 256;
        cfg.scheduler.swap_preemption = swap;
        cfg.eos_token_ids = m.loaded->config.eos_token_ids;
        EngineCore core(cfg, *ex);
        for (const Request& r : reqs) core.add_request(r);
        TokensById got;
        while (core.has_unfinished()) {
            for (const RequestOutput& o : core.step())
                got[o.request_id].insert(got[o.request_id].end(), o.token_ids.begin(), o.token_ids.end());
            check_invariants(core);
        }
        *st = core.stats();
        return got;
    };
    EngineStats large_st, recompute_st, swap_st;
    const TokensById large = run(64, 0, false, &large_st);
    const TokensById recompute = run(6, 0, false, &recompute_st);
    const TokensById swap = run(6, static_cast<int64_t>(16 * block_bytes), true, &swap_st);
    EXPECT_EQ(recompute, large);
    EXPECT_EQ(swap, large);
    EXPECT_GT(swap_st.swap_preemptions, 0u);
    EXPECT_GT(swap_st.kv_swapped_in_blocks, 0u);
}

}  // namespace
}  // namespace peregrine::testing
