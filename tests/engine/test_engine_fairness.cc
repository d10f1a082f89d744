// Running slots under load: forked choices never take the running sequences past
// max_num_seqs, and a client call with many sequences cannot keep a small one waiting behind
// its whole queue (issue 17: an 8,192-sequence request made a 5-token request wait 35.7 s).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/engine_core.h"
#include "support/fake_executor.h"

namespace peregrine::testing {
namespace {

Request request(const std::string& id, int max_tokens, int n = 1, const std::string& group = "") {
    Request r;
    r.id = id;
    r.prompt_ids = {1, 2, 3, 4, 5};
    r.sampling.max_tokens = max_tokens;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 7;
    r.sampling.ignore_eos = true;
    r.sampling.n = n;
    r.group = group;
    return r;
}

CoreConfig config(int max_num_seqs) {
    CoreConfig cfg;
    cfg.scheduler.max_num_seqs = max_num_seqs;
    return cfg;
}

// Steps until `id` ends; returns how many steps that took (or -1 after `limit`), checking the
// running cap at every step.
int steps_until_done(EngineCore& core, const std::string& id, int max_num_seqs, int limit = 100000) {
    for (int step = 1; step <= limit && core.has_unfinished(); ++step) {
        for (const RequestOutput& o : core.step())
            if (o.request_id == id && o.usage) return step;
        EXPECT_LE(core.stats().num_running, max_num_seqs);
    }
    return -1;
}

TEST(EngineFairness, ForkedChoicesStayWithinMaxNumSeqs) {
    FakeExecutor ex(1024, 4);
    EngineCore core(config(8), ex);
    for (int i = 0; i < 6; ++i) core.add_request(request("r" + std::to_string(i), 20, 4));
    int peak = 0;
    while (core.has_unfinished()) {
        core.step();
        peak = std::max(peak, core.stats().num_running);
        ASSERT_LE(core.stats().num_running, 8);
    }
    EXPECT_EQ(peak, 8);  // two requests of 4 choices at a time, the slots full
    EXPECT_EQ(core.block_manager().num_used(), 0);
}

TEST(EngineFairness, NAboveMaxNumSeqsIsRefused) {
    FakeExecutor ex(64, 4);
    EngineCore core(config(4), ex);
    try {
        core.add_request(request("big", 4, 5));
        FAIL() << "n = 5 with max_num_seqs 4 was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind("n ", 0), 0u) << e.what();  // the server names 'n'
    }
    core.add_request(request("fits", 4, 4));
    EXPECT_GT(steps_until_done(core, "fits", 4), 0);
}

// One call of 64 prompts (one group) fills the slots first; a small call arriving after it
// runs as soon as one of the big call's sequences ends, not after all 64.
TEST(EngineFairness, ASmallCallDoesNotWaitBehindABigOne) {
    FakeExecutor ex(4096, 4);
    EngineCore core(config(4), ex);
    for (int i = 0; i < 64; ++i) core.add_request(request("big-" + std::to_string(i), 10, 1, "big"));
    core.step();  // the big call takes every slot
    core.add_request(request("small", 5));
    const int small_steps = steps_until_done(core, "small", 4);
    // One wave of the big call is 10 steps; without fairness the small call waits 16 waves.
    EXPECT_GT(small_steps, 0);
    EXPECT_LE(small_steps, 10 + 5 + 2) << "the small call waited behind the big call's queue";
    steps_until_done(core, "", 4);
    EXPECT_FALSE(core.has_unfinished());
    EXPECT_EQ(core.block_manager().num_used(), 0);
}

// Fairness yields to priority: a more urgent call is admitted first even from a group that
// already holds its share, and with one group only every slot is used.
TEST(EngineFairness, PriorityFirstAndWorkConserving) {
    FakeExecutor ex(4096, 4);
    EngineCore core(config(4), ex);
    for (int i = 0; i < 8; ++i) core.add_request(request("big-" + std::to_string(i), 6, 1, "big"));
    core.step();
    EXPECT_EQ(core.stats().num_running, 4);  // alone, the big call takes every slot
    Request urgent = request("urgent", 3, 1, "big");
    urgent.priority = -1;
    core.add_request(urgent);
    core.add_request(request("other", 3));
    int urgent_done = -1, other_done = -1;
    for (int step = 1; core.has_unfinished(); ++step)
        for (const RequestOutput& o : core.step()) {
            if (o.usage && o.request_id == "urgent") urgent_done = step;
            if (o.usage && o.request_id == "other") other_done = step;
        }
    ASSERT_GT(urgent_done, 0);
    ASSERT_GT(other_done, 0);
    EXPECT_LE(urgent_done, other_done);
}

}  // namespace
}  // namespace peregrine::testing
