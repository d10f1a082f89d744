// The threaded Engine: submit and abort from many threads, every stream ends, every block
// is freed, shutdown aborts what is left.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/error.h"
#include "engine/engine_loop.h"
#include "peregrine/engine.h"
#include "support/fake_executor.h"

namespace peregrine::testing {
namespace {

Request request(const std::string& id, int max_tokens, int n = 1) {
    Request r;
    r.id = id;
    r.prompt_ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sampling.n = n;
    return r;
}

TEST(EngineThreads, ConcurrentClientsStreamAndAbort) {
    Engine engine(std::make_unique<EngineLoop>(CoreConfig{}, std::make_unique<FakeExecutor>(256, 4), nullptr));
    std::atomic<int> finished{0}, aborted{0}, tokens{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c) {
        clients.emplace_back([&, c] {
            for (int i = 0; i < 10; ++i) {
                const std::string id = "c" + std::to_string(c) + "-" + std::to_string(i);
                auto stream = engine.submit(request(id, 5 + i, 1 + i % 2));
                const bool cut = i % 3 == 0;
                RequestOutput out;
                int got = 0;
                bool saw_usage = false;
                while (stream->next(out)) {
                    got += static_cast<int>(out.token_ids.size());
                    if (cut && got >= 2) engine.abort(id);
                    if (out.finish == FinishReason::Abort) ++aborted;
                    saw_usage = saw_usage || out.usage.has_value();
                }
                EXPECT_TRUE(saw_usage) << id;
                tokens += got;
                ++finished;
            }
        });
    }
    for (auto& t : clients) t.join();
    EXPECT_EQ(finished, 80);
    EXPECT_GT(aborted, 0);
    for (int i = 0; i < 100 && engine.stats().num_running + engine.stats().num_waiting > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.num_running + s.num_waiting, 0);
    EXPECT_EQ(s.num_kv_blocks_used, 0);
}

TEST(EngineThreads, SubmitChecksOnTheCallersThread) {
    Engine engine(
        std::make_unique<EngineLoop>(CoreConfig{}, std::make_unique<FakeExecutor>(2048, 4, 97, 8192), nullptr));
    Request r = request("bad", 4);
    r.prompt_ids = {1, 1000};
    EXPECT_THROW(engine.submit(r), Error);
    Request s = request("stops", 4);
    s.sampling.stop = {"x"};  // this engine has no tokenizer to match them
    EXPECT_THROW(engine.submit(s), Error);
    auto a = engine.submit(request("dup", 8000));  // runs until aborted
    EXPECT_THROW(engine.submit(request("dup", 4)), Error);
    engine.abort("dup");
    RequestOutput out;
    while (a->next(out)) {
    }
    EXPECT_NO_THROW(engine.submit(request("dup", 4)));  // the id is free again
}

TEST(EngineThreads, ShutdownAbortsWhatIsRunning) {
    auto engine = std::make_unique<Engine>(
        std::make_unique<EngineLoop>(CoreConfig{}, std::make_unique<FakeExecutor>(2048, 4, 97, 8192), nullptr));
    auto stream = engine->submit(request("long", 8000));
    RequestOutput out;
    ASSERT_TRUE(stream->next(out));
    engine->shutdown();
    FinishReason last = FinishReason::None;
    while (stream->next(out)) last = out.finish;
    EXPECT_EQ(last, FinishReason::Abort);
}

}  // namespace
}  // namespace peregrine::testing
