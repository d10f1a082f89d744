// The block machinery over an FP8 KV cache (--kv-cache-dtype fp8) on the CPU backend: a block
// is codes and scales in one run of bytes, so prefix hits, the host tier, swap preemption and
// copy-on-write give the tokens a pool large enough for none of them gives, bit for bit.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <utility>

#include "core/kv_fp8.h"
#include "engine/engine_core.h"
#include "support/block_invariants.h"
#include "support/golden_util.h"
#include "support/greedy_request.h"
#include "worker/local_executor.h"

namespace peregrine::testing {
namespace {

using Choices = std::map<std::pair<std::string, int>, std::vector<int32_t>>;

struct RunOptions {
    int blocks = 256;
    int64_t host_bytes = 0;
    bool swap = false;
};

// All of `reqs` through one engine over `m` (two arrive before each step), every choice's tokens.
Choices run(TestModel& m, const std::vector<Request>& reqs, const RunOptions& o, EngineStats* stats) {
    auto ex = LocalExecutor::over(*m.backend, *m.model, o.blocks, 16, nullptr, o.host_bytes);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 256;
    cfg.scheduler.swap_preemption = o.swap;
    cfg.eos_token_ids = m.loaded->config.eos_token_ids;
    EngineCore core(cfg, *ex);
    Choices got;
    size_t next = 0;
    while (next < reqs.size() || core.has_unfinished()) {
        for (int k = 0; k < 2 && next < reqs.size(); ++k) core.add_request(reqs[next++]);
        for (const RequestOutput& out : core.step()) {
            auto& tokens = got[{out.request_id, out.index}];
            tokens.insert(tokens.end(), out.token_ids.begin(), out.token_ids.end());
        }
        check_invariants(core);
    }
    EXPECT_EQ(core.block_manager().num_used(), 0);
    *stats = core.stats();
    return got;
}

std::unique_ptr<TestModel> fp8_model() {
    auto m = std::make_unique<TestModel>(models_dir() + "/stories260K");
    m->backend->set_kv_cache_dtype(DType::F8_E4M3);
    return m;
}

TEST(EngineFp8Kv, ThePoolIsFp8) {
    auto m = fp8_model();
    const KvCacheShape shape = m->model->kv_cache_shape(1, 16);
    EXPECT_EQ(shape.dtype, DType::F8_E4M3);
    // stories260K: 5 layers, 4 kv heads of 8: (8 codes + 2 scale bytes) per token and head.
    EXPECT_EQ(shape.bytes_per_block(), size_t{5} * 2 * 16 * 4 * (8 + 2));
    auto ex = LocalExecutor::over(*m->backend, *m->model, 8, 16);
    EXPECT_EQ(ex->kv_block_bytes(), shape.bytes_per_block());
    EXPECT_EQ(ex->kv_cache_dtype(), "f8_e4m3");
}

TEST(EngineFp8Kv, HostTierAndPrefixHitsMatchALargePool) {
    auto m = fp8_model();
    const std::vector<Request> reqs = shared_system_requests(21, 2, 64, 5);
    const size_t block_bytes = m->model->kv_cache_shape(1, 16).bytes_per_block();
    EngineStats large_st, none_st, tier_st;
    const Choices large = run(*m, reqs, {256, 0, false}, &large_st);
    const Choices none = run(*m, reqs, {7, 0, false}, &none_st);
    const Choices tier = run(*m, reqs, {7, static_cast<int64_t>(32 * block_bytes), false}, &tier_st);
    EXPECT_EQ(none, large);
    EXPECT_EQ(tier, large);
    EXPECT_GT(large_st.prefix_hits, 0u);
    EXPECT_GT(tier_st.kv_onloaded_blocks, 0u);
    EXPECT_GT(tier_st.host_prefix_hits, 0u);
    EXPECT_EQ(tier_st.kv_block_bytes, block_bytes);
    EXPECT_EQ(tier_st.kv_cache_dtype, "f8_e4m3");
}

TEST(EngineFp8Kv, SwapPreemptionMatchesALargePool) {
    auto m = fp8_model();
    std::vector<Request> reqs;
    for (int k = 0; k < 4; ++k) {
        std::vector<int32_t> prompt{1};
        for (int i = 0; i < 20 + 3 * k; ++i) prompt.push_back(3 + (k * 53 + i * 17) % 500);
        reqs.push_back(greedy_request("m" + std::to_string(k), std::move(prompt), 32));
    }
    const size_t block_bytes = m->model->kv_cache_shape(1, 16).bytes_per_block();
    EngineStats large_st, swap_st, recompute_st;
    const Choices large = run(*m, reqs, {64, 0, false}, &large_st);
    const Choices recompute = run(*m, reqs, {6, 0, false}, &recompute_st);
    const Choices swap = run(*m, reqs, {6, static_cast<int64_t>(16 * block_bytes), true}, &swap_st);
    EXPECT_EQ(recompute, large);
    EXPECT_EQ(swap, large);
    EXPECT_GT(recompute_st.preemptions, 0u);
    EXPECT_GT(swap_st.swap_preemptions, 0u);
    EXPECT_GT(swap_st.kv_swapped_in_blocks, 0u);
}

// n = 3 seeded choices share their prompt's blocks and copy the partial last one on write.
TEST(EngineFp8Kv, CopyOnWriteChoicesMatchALargePool) {
    auto m = fp8_model();
    std::vector<Request> reqs;
    for (int k = 0; k < 3; ++k) {
        std::vector<int32_t> prompt{1};
        for (int i = 0; i < 21 + 5 * k; ++i) prompt.push_back(3 + (k * 31 + i * 7) % 500);
        Request r = greedy_request("c" + std::to_string(k), std::move(prompt), 20);
        r.sampling.n = 3;
        r.sampling.temperature = 0.9f;
        r.sampling.seed = 40 + k;
        reqs.push_back(std::move(r));
    }
    EngineStats large_st, small_st;
    const Choices large = run(*m, reqs, {128, 0, false}, &large_st);
    const Choices small = run(*m, reqs, {12, 0, false}, &small_st);
    ASSERT_EQ(large.size(), 9u);
    EXPECT_EQ(small, large);
    int distinct = 0;
    for (int k = 0; k < 3; ++k)
        distinct += large.at({"c" + std::to_string(k), 0}) != large.at({"c" + std::to_string(k), 1});
    EXPECT_GT(distinct, 0) << "seeded choices should differ (else nothing was copied and written apart)";
}

}  // namespace
}  // namespace peregrine::testing
