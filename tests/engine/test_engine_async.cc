// Async scheduling (CoreConfig::async_scheduling): step N+1 is queued before step N's draws
// come back, its sequences naming those draws as input tokens. On the fake executor's device
// mode the outputs must equal those of waiting for every step, and of CPU sampling, under
// preemption, prefix caching, n > 1, stops, penalties (which turn the overlap off) and aborts.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "engine/engine_core.h"
#include "support/fake_executor.h"

namespace peregrine::testing {
namespace {

enum class Mode { Cpu, DeviceSync, DeviceAsync };

struct Outcome {
    std::map<std::pair<std::string, int>, std::vector<int32_t>> tokens;
    std::map<std::pair<std::string, int>, FinishReason> finish;
    std::map<std::string, int> cached;  // usage.cached_tokens per request
    size_t fed = 0;
    size_t steps = 0;
};

constexpr int32_t kEos = 7;

// Requests arrive 0-2 before each step (from `seed`); `aborts` maps a step number to a request
// to abort before it. Checks that every block is free at the end.
Outcome run(const std::vector<Request>& reqs, Mode mode, int blocks, int budget, uint32_t seed,
            const std::map<int, std::string>& aborts = {}) {
    FakeExecutor ex(blocks, 4);
    if (mode != Mode::Cpu) ex.enable_device_sampling(64);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.scheduler.max_num_seqs = 16;
    cfg.eos_token_ids = {kEos};
    cfg.async_scheduling = mode == Mode::DeviceAsync;
    EngineCore core(cfg, ex);
    std::mt19937 rng(seed);
    Outcome o;
    size_t next = 0;
    for (int step = 0; next < reqs.size() || core.has_unfinished(); ++step) {
        for (int k = rng() % 3; k > 0 && next < reqs.size(); --k) core.add_request(reqs[next++]);
        if (const auto a = aborts.find(step); a != aborts.end()) core.abort_request(a->second);
        for (const RequestOutput& out : core.step()) {
            auto& v = o.tokens[{out.request_id, out.index}];
            v.insert(v.end(), out.token_ids.begin(), out.token_ids.end());
            if (out.finish != FinishReason::None) o.finish[{out.request_id, out.index}] = out.finish;
            if (out.usage) o.cached[out.request_id] = out.usage->cached_tokens;
        }
        EXPECT_LT(step, 100000);
        if (step >= 100000) break;
    }
    EXPECT_EQ(core.block_manager().num_used(), 0);
    o.fed = ex.fed_;
    o.steps = core.stats().steps;
    return o;
}

std::vector<Request> traffic(uint32_t seed, bool with_cpu_only_features) {
    std::mt19937 rng(seed);
    const std::vector<int32_t> prefix = {1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13};
    std::vector<Request> reqs;
    for (int i = 0; i < 60; ++i) {
        Request r;
        r.id = "q" + std::to_string(i);
        if (rng() % 2) r.prompt_ids = prefix;
        for (int j = 1 + rng() % 14; j > 0; --j) r.prompt_ids.push_back(rng() % 97);
        SamplingParams& p = r.sampling;
        p.max_tokens = 1 + rng() % 24;
        p.temperature = (rng() % 2) * 0.9f;
        p.seed = 100 + i;
        p.n = rng() % 5 == 0 ? 2 + rng() % 2 : 1;
        p.ignore_eos = rng() % 3 == 0;  // else the vocabulary's 7 ends it now and then
        if (rng() % 6 == 0) p.stop_token_ids = {static_cast<int32_t>(rng() % 97)};
        if (rng() % 4 == 0) p.logprobs = 2;
        if (with_cpu_only_features) {
            if (rng() % 8 == 0) p.presence_penalty = 0.5f;
            if (rng() % 8 == 0) p.min_tokens = 3;
            if (rng() % 10 == 0) p.logit_bias.emplace_back(static_cast<int32_t>(rng() % 97), 2.0f);
        }
        reqs.push_back(std::move(r));
    }
    return reqs;
}

void expect_same(const Outcome& want, const Outcome& got, const char* what) {
    EXPECT_EQ(want.tokens, got.tokens) << what;
    EXPECT_EQ(want.finish, got.finish) << what;
}

TEST(EngineAsync, SameOutputsAsWaitingForEachStep) {
    for (bool cpu_only_features : {false, true})
        for (int blocks : {512, 40}) {  // 40 blocks of 4: preemption
            SCOPED_TRACE(::testing::Message() << "blocks " << blocks << ", cpu-only features " << cpu_only_features);
            const std::vector<Request> reqs = traffic(blocks + cpu_only_features, cpu_only_features);
            const Outcome cpu = run(reqs, Mode::Cpu, blocks, 24, 5);
            const Outcome sync = run(reqs, Mode::DeviceSync, blocks, 24, 5);
            const Outcome async = run(reqs, Mode::DeviceAsync, blocks, 24, 5);
            expect_same(cpu, sync, "device sampling, sync");
            expect_same(cpu, async, "device sampling, async");
            EXPECT_EQ(sync.fed, 0u);
            // (Penalised sequences turn the overlap off while they live: with fair sharing of the
            // running slots they overlap more in time, 10 of the steps overlapped at 40 blocks.)
            EXPECT_GT(async.fed, cpu_only_features ? 5u : 100u) << "async scheduling seldom queued a step ahead";
            size_t stopped = 0;
            for (const auto& [k, f] : cpu.finish) stopped += f == FinishReason::Stop;
            EXPECT_GT(stopped, 0u) << "no request ended on EOS or a stop token";
        }
}

// The blocks a step fills with placeholder tokens are hashed for the prefix cache only once
// the tokens are known: a prompt that repeats a finished request's output hits them.
TEST(EngineAsync, GeneratedBlocksAreCachedUnderTheirRealTokens) {
    Request a;
    a.id = "a";
    a.prompt_ids = {20, 21, 22, 23, 24};
    a.sampling.max_tokens = 19;
    a.sampling.temperature = 0.0f;
    a.sampling.ignore_eos = true;
    const Outcome first = run({a}, Mode::Cpu, 64, 24, 1);
    Request b = a;
    b.id = "b";
    b.sampling.max_tokens = 3;
    const auto& out = first.tokens.at({"a", 0});
    b.prompt_ids.insert(b.prompt_ids.end(), out.begin(), out.end());  // 24 tokens: 6 full blocks
    for (Mode m : {Mode::DeviceSync, Mode::DeviceAsync}) {
        FakeExecutor ex(64, 4);
        ex.enable_device_sampling(64);
        CoreConfig cfg;
        cfg.async_scheduling = m == Mode::DeviceAsync;
        EngineCore core(cfg, ex);
        core.add_request(a);
        while (core.has_unfinished()) core.step();
        core.add_request(b);
        int cached = -1;
        while (core.has_unfinished())
            for (const RequestOutput& o : core.step())
                if (o.usage) cached = o.usage->cached_tokens;
        // All but the last block (the last prompt token is always computed).
        EXPECT_EQ(cached, 20) << (m == Mode::DeviceAsync ? "async" : "sync");
        if (m == Mode::DeviceAsync) {
            EXPECT_GT(ex.fed_, 10u);
        }
    }
}

// Choices forked from a prompt start from its committed blocks in every mode: no choice
// recomputes the prompt (10 prompt tokens, then 4 choices x 5 decode steps).
TEST(EngineAsync, ForkedChoicesDoNotRecomputeThePrompt) {
    for (Mode m : {Mode::Cpu, Mode::DeviceSync, Mode::DeviceAsync}) {
        FakeExecutor ex(64, 4);
        if (m != Mode::Cpu) ex.enable_device_sampling(64);
        CoreConfig cfg;
        cfg.async_scheduling = m == Mode::DeviceAsync;
        EngineCore core(cfg, ex);
        Request r;
        r.id = "n4";
        r.prompt_ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        r.sampling.n = 4;
        r.sampling.max_tokens = 6;
        r.sampling.seed = 3;
        r.sampling.ignore_eos = true;
        core.add_request(r);
        while (core.has_unfinished()) core.step();
        EXPECT_EQ(ex.tokens_, 10u + 4 * 5) << static_cast<int>(m);
        EXPECT_EQ(core.block_manager().num_used(), 0);
    }
}

// An abort between steps drops the draws still in flight for it; everything else goes on.
TEST(EngineAsync, AbortWhileAStepIsInFlight) {
    const std::vector<Request> reqs = traffic(9, false);
    std::map<int, std::string> aborts;
    for (int s = 3; s < 60; s += 4) aborts[s] = "q" + std::to_string(s / 2);
    const Outcome sync = run(reqs, Mode::DeviceSync, 512, 24, 3, aborts);
    const Outcome async = run(reqs, Mode::DeviceAsync, 512, 24, 3, aborts);
    EXPECT_GT(async.fed, 100u);
    int compared = 0;
    for (const auto& [key, toks] : sync.tokens) {
        bool aborted = false;
        for (const auto& [s, id] : aborts) aborted |= id == key.first;
        if (aborted) {  // fewer or as many tokens as the sync run gave it: one step may differ
            EXPECT_EQ(async.finish.count(key), 1u);
            continue;
        }
        EXPECT_EQ(async.tokens.at(key), toks) << key.first;
        ++compared;
    }
    EXPECT_GT(compared, 30);
}

// While a request waits, no step is queued ahead: the next one is scheduled once the tokens of
// the one in flight are back, so a request that arrives during that step still joins the next
// (on a GPU, one step of TTFT less). Decode-only stretches overlap as before.
TEST(EngineAsync, NoStepQueuedAheadWhileARequestWaits) {
    FakeExecutor ex(512, 4);
    ex.enable_device_sampling(64);
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 24;
    cfg.async_scheduling = true;
    EngineCore core(cfg, ex);
    Request a;
    a.id = "a";
    a.prompt_ids = {1, 2, 3, 4};
    a.sampling.max_tokens = 40;
    a.sampling.ignore_eos = true;
    core.add_request(a);
    for (int i = 0; i < 5; ++i) core.step();
    const size_t fed_decoding = ex.fed_;
    core.step();
    EXPECT_GT(ex.fed_, fed_decoding) << "a decode-only stretch should queue steps ahead";
    Request b = a;
    b.id = "b";
    b.prompt_ids = {5, 6, 7, 8, 9};
    core.add_request(b);
    const size_t fed_before = ex.fed_;
    core.step();  // b waits: the in-flight step is collected, nothing queued behind it
    EXPECT_EQ(ex.fed_, fed_before) << "a step was queued ahead while a request waited";
    core.step();  // b is scheduled now, and nothing waits: overlap again
    core.step();
    EXPECT_GT(ex.fed_, fed_before);
    while (core.has_unfinished()) core.step();
}

}  // namespace
}  // namespace peregrine::testing
