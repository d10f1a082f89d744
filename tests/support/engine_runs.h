// Running a list of requests through an EngineCore on a TestModel: each alone, or as a crowd
// arriving a few per step. Shared by the CPU and GPU "crowd matches alone" tests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "support/golden_util.h"
#include "worker/executor.h"
#include "worker/local_executor.h"

namespace peregrine::testing {

using TokensById = std::map<std::string, std::vector<int32_t>>;

// Each request in an engine of its own (16 blocks of 16 tokens, default scheduler).
inline TokensById run_alone(TestModel& m, const std::vector<Request>& reqs) {
    TokensById out;
    for (const Request& r : reqs) {
        auto ex_exec = LocalExecutor::over(*m.backend, *m.model, 16, 16);
        LocalExecutor& ex = *ex_exec;
        EngineCore core({}, ex);
        core.add_request(r);
        while (core.has_unfinished())
            for (const RequestOutput& o : core.step())
                out[r.id].insert(out[r.id].end(), o.token_ids.begin(), o.token_ids.end());
    }
    return out;
}

// All requests in one engine with `budget` tokens a step and `blocks` KV blocks, 0-3 of them
// arriving before each step (random, from arrival_seed). Checks every block is free at the end.
inline TokensById run_crowd(TestModel& m, const std::vector<Request>& reqs, int budget, int blocks,
                            uint32_t arrival_seed, EngineStats* stats = nullptr) {
    auto ex_exec = LocalExecutor::over(*m.backend, *m.model, blocks, 16);
    LocalExecutor& ex = *ex_exec;
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.eos_token_ids = m.loaded->config.eos_token_ids;
    EngineCore core(cfg, ex);
    std::mt19937 rng(arrival_seed);
    TokensById got;
    size_t next = 0;
    while (next < reqs.size() || core.has_unfinished()) {
        for (int k = rng() % 4; k > 0 && next < reqs.size(); --k) core.add_request(reqs[next++]);
        for (const RequestOutput& o : core.step())
            got[o.request_id].insert(got[o.request_id].end(), o.token_ids.begin(), o.token_ids.end());
    }
    if (stats) *stats = core.stats();
    EXPECT_EQ(core.block_manager().num_used(), 0);
    return got;
}

}  // namespace peregrine::testing
