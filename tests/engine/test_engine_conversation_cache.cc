// Conversation caches and pinned prefixes: under eviction pressure a request's prompt_cache_key
// keeps its blocks cached after anonymous ones go (device pool and host tier), and a pinned
// prefix stays a cache hit however often the pool is cycled.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/host_block_pool.h"
#include "engine/pinned_prefix.h"
#include "support/block_invariants.h"
#include "support/fake_executor.h"
#include "support/golden_util.h"

namespace peregrine::testing {
namespace {

// Runs one request to its end; returns its usage.
Usage run_one(EngineCore& core, const std::string& id, const std::vector<int32_t>& prompt,
              const std::string& key = "") {
    Request r;
    r.id = id;
    r.prompt_ids = prompt;
    r.prompt_cache_key = key;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 4;
    r.sampling.ignore_eos = true;
    core.add_request(r);
    Usage u;
    while (core.has_unfinished()) {
        for (const RequestOutput& o : core.step())
            if (o.usage) u = *o.usage;
        check_invariants(core);
    }
    return u;
}

std::vector<int32_t> prompt(int first) {
    std::vector<int32_t> p(21);  // 5 full blocks of 4 can be hits (the last token never is)
    for (int i = 0; i < 21; ++i) p[i] = first + i;
    return p;
}

TEST(ConversationCache, AKeyedPrefixOutlivesAnAnonymousOne) {
    // 24 blocks of 4: A (keyed) and B (anonymous) leave 6 cached blocks each; three more
    // anonymous prompts need 18 blocks, so 6 cached ones are evicted: all of B's.
    for (const bool keyed : {true, false}) {
        FakeExecutor ex(24, 4, /*vocab=*/256);
        EngineCore core({}, ex);
        run_one(core, "a", prompt(1), keyed ? "conversation-a" : "");
        run_one(core, "b", prompt(30));
        for (int k = 0; k < 3; ++k) run_one(core, "c" + std::to_string(k), prompt(60 + 21 * k));
        const Usage a = run_one(core, "a2", prompt(1), keyed ? "conversation-a" : "");
        const Usage b = run_one(core, "b2", prompt(30));
        if (keyed) {
            EXPECT_EQ(a.cached_tokens, 20) << "the conversation's blocks were kept";
            EXPECT_EQ(b.cached_tokens, 0) << "the anonymous prompt's went first";
        } else {
            EXPECT_EQ(a.cached_tokens, 0) << "LRU: the oldest prompt goes first";
        }
    }
}

TEST(ConversationCache, TheHostTierKeepsKeyedBlocksLonger) {
    HostBlockPool pool(3, 2, EvictionPolicy::Lru);
    const int32_t t[2] = {1, 2};
    EXPECT_GE(pool.store(100, std::nullopt, t, 1, /*keyed=*/true).slot, 0);
    EXPECT_GE(pool.store(101, std::nullopt, t, 1).slot, 0);
    EXPECT_GE(pool.store(102, std::nullopt, t, 1).slot, 0);
    for (uint64_t h = 103; h < 110; ++h) {
        const HostBlockPool::Stored st = pool.store(h, std::nullopt, t, 1);
        ASSERT_TRUE(st.evicted);
        EXPECT_NE(*st.evicted, 100u) << "the keyed block is the last victim";
    }
    EXPECT_GE(pool.find(100, t), 0);
    // Only keyed blocks left: they go in policy order among themselves.
    HostBlockPool keyed(2, 2, EvictionPolicy::Lru);
    keyed.store(1, std::nullopt, t, 1, true);
    keyed.store(2, std::nullopt, t, 1, true);
    EXPECT_EQ(keyed.store(3, std::nullopt, t, 1, true).evicted, std::optional<uint64_t>(1));
}

TEST(ConversationCache, APinnedPrefixSurvivesAnyNumberOfCycles) {
    FakeExecutor ex(12, 4);
    CoreConfig cfg;
    std::vector<int32_t> system(9);  // 2 full blocks pinned (the 9th token is not)
    for (int i = 0; i < 9; ++i) system[i] = 50 + i;
    cfg.pinned_prefixes = {system};
    EngineCore core(cfg, ex);
    EXPECT_EQ(core.stats().pinned_prefix_tokens, 8u);
    EXPECT_EQ(core.block_manager().num_used(), 2);
    check_invariants(core);
    for (int k = 0; k < 20; ++k) {  // 20 other prompts of 21 tokens: the pool turns over many times
        run_one(core, "x" + std::to_string(k), prompt(1 + 3 * k));
        std::vector<int32_t> p = system;
        for (int i = 0; i < 6; ++i) p.push_back(1 + (k * 7 + i) % 90);
        EXPECT_GE(run_one(core, "s" + std::to_string(k), p).cached_tokens, 8) << "round " << k;
    }
    EXPECT_GT(core.stats().evictions, 20u);
    EXPECT_EQ(core.block_manager().num_used(), 2) << "only the pin holds blocks between requests";
}

TEST(ConversationCache, PinsAreRefusedWhenTheyWouldTakeHalfThePool) {
    FakeExecutor ex(12, 4);
    EngineCore core({}, ex);
    std::vector<int32_t> big(29);  // 7 full blocks of 12
    for (int i = 0; i < 29; ++i) big[i] = 1 + i;
    EXPECT_THROW(core.pin_prefix(big), Error);
    big.resize(25);  // 6 blocks: exactly half
    EXPECT_EQ(core.pin_prefix(big), 24);
    CoreConfig off;
    off.prefix_caching = false;
    EngineCore no_cache(off, ex);
    EXPECT_THROW(no_cache.pin_prefix(big), Error);
}

TEST(ConversationCache, PinnedPrefixFiles) {
    const std::string model = models_dir() + "/stories260K";
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "pg_pin_prefix_test";
    std::filesystem::create_directories(dir);
    auto write = [&](const std::string& name, const std::string& text) {
        std::ofstream(dir / name) << text;
        return (dir / name).string();
    };
    const Tokenizer tok = Tokenizer::load(model);
    ModelInfo info;
    info.model_dir = model;
    const std::string text = "Once upon a time there was a little dog.";
    EngineConfig c;
    const auto plain = pinned_prefix_tokens({write("plain.txt", text)}, c, info, tok);
    ASSERT_EQ(plain.size(), 1u);
    EXPECT_EQ(plain[0], tok.encode(text, true, true)) << "tokenized as a completion prompt is";
    const std::string chat_file = write("chat.json", R"({"messages": [{"role": "system", "content": "Be kind."}]})");
    EXPECT_THROW(pinned_prefix_tokens({chat_file}, c, info, tok), Error) << "no renderer";
    c.render_pinned_chat = [](const std::string& messages, const ModelInfo&, const Tokenizer&) {
        const nlohmann::json m = nlohmann::json::parse(messages);
        return "<" + m[0]["role"].get<std::string>() + ">" + m[0]["content"].get<std::string>();
    };
    EXPECT_EQ(pinned_prefix_tokens({chat_file}, c, info, tok)[0], tok.encode("<system>Be kind.", false, true))
        << "rendered, no BOS added";
    EXPECT_THROW(pinned_prefix_tokens({(dir / "missing.txt").string()}, c, info, tok), Error);
    EXPECT_THROW(pinned_prefix_tokens({write("empty.txt", "")}, c, info, tok), Error);
    EXPECT_THROW(pinned_prefix_tokens({write("bad.json", R"({"prompt": "x"})")}, c, info, tok), Error);
    c.render_pinned_chat = [](const std::string&, const ModelInfo&, const Tokenizer&) -> std::string {
        fail("the template raised");
    };
    EXPECT_THROW(pinned_prefix_tokens({chat_file}, c, info, tok), Error);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace peregrine::testing
