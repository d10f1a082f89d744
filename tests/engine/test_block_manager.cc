// BlockManager alone: prefix hits, eviction order under each policy, copy-on-write.
#include <gtest/gtest.h>

#include "engine/block_manager.h"
#include "support/block_sequences.h"

namespace peregrine {
namespace {

// Hits the cached prefix `tokens` `times` times (each a use for LFU and a release for LRU).
void touch_prefix(BlockManager& bm, const std::vector<int32_t>& tokens, uint64_t id, int times) {
    std::vector<std::pair<int32_t, int32_t>> copies;
    for (int i = 0; i < times; ++i) {
        Sequence again = seq_of(tokens, id + 100 + i);
        again.tokens.push_back(0);  // so that every prompt block can hit
        const auto h = bm.match_prefix(again);
        ASSERT_EQ(h.size() * bm.block_size(), tokens.size());
        bm.allocate(again, 0, h, copies);  // adopt the hits only: no block is taken
        bm.release(again);
    }
}

// Runs a sequence's prompt into the cache (all blocks full and hashed), releases it, then
// hits it `reuse` more times.
void cache_prompt(BlockManager& bm, std::vector<int32_t> tokens, uint64_t id, int reuse = 0) {
    Sequence s = seq_of(tokens, id);
    std::vector<std::pair<int32_t, int32_t>> copies;
    ASSERT_TRUE(bm.can_allocate(s, s.num_tokens()));
    bm.allocate(s, s.num_tokens(), {}, copies);
    bm.commit(s, s.num_tokens());
    bm.release(s);
    touch_prefix(bm, tokens, id, reuse);
}

// Which of the three one-block prompts survive one more allocation in a full pool of 3.
std::vector<bool> survivors(EvictionPolicy policy) {
    BlockManager bm(3, 2, policy);
    cache_prompt(bm, {1, 1}, 1);     // cached first
    cache_prompt(bm, {2, 2}, 2);     // cached second
    cache_prompt(bm, {3, 3}, 3);     // cached last
    touch_prefix(bm, {1, 1}, 4, 2);  // then prompt 1 is used twice more, prompt 3 once
    touch_prefix(bm, {3, 3}, 5, 1);
    EXPECT_EQ(bm.num_available(), 3);
    Sequence fresh = seq_of({9, 9}, 9);
    std::vector<std::pair<int32_t, int32_t>> copies;
    bm.allocate(fresh, 2, {}, copies);  // must evict one
    EXPECT_EQ(bm.stats().evictions, 1u);
    std::vector<bool> alive;
    for (int32_t t : {1, 2, 3}) {
        Sequence probe = seq_of({t, t, 0}, 50 + t);
        alive.push_back(!bm.match_prefix(probe).empty());
    }
    return alive;
}

TEST(BlockManager, EvictionPolicies) {
    // LRU: prompt 2 was released longest ago (1 and 3 were touched again later).
    EXPECT_EQ(survivors(EvictionPolicy::Lru), (std::vector<bool>{true, false, true}));
    // LFU: prompt 2 has the fewest uses.
    EXPECT_EQ(survivors(EvictionPolicy::Lfu), (std::vector<bool>{true, false, true}));
    // FIFO: prompt 1 was cached first, however often it was used.
    EXPECT_EQ(survivors(EvictionPolicy::Fifo), (std::vector<bool>{false, true, true}));
}

TEST(BlockManager, LruAndLfuDisagreeWhenRecencyAndFrequencyDo) {
    for (EvictionPolicy p : {EvictionPolicy::Lru, EvictionPolicy::Lfu}) {
        BlockManager bm(2, 2, p);
        cache_prompt(bm, {1, 1}, 1, 3);  // frequent, but released first
        cache_prompt(bm, {2, 2}, 2, 0);  // rare, released last
        Sequence fresh = seq_of({9, 9}, 9);
        std::vector<std::pair<int32_t, int32_t>> copies;
        bm.allocate(fresh, 2, {}, copies);
        Sequence probe1 = seq_of({1, 1, 0}, 71), probe2 = seq_of({2, 2, 0}, 72);
        const bool keeps_frequent = !bm.match_prefix(probe1).empty();
        const bool keeps_recent = !bm.match_prefix(probe2).empty();
        if (p == EvictionPolicy::Lru) {
            EXPECT_FALSE(keeps_frequent);
            EXPECT_TRUE(keeps_recent);
        } else {
            EXPECT_TRUE(keeps_frequent);
            EXPECT_FALSE(keeps_recent);
        }
    }
}

TEST(BlockManager, PrefixHitNeverIncludesTheLastToken) {
    BlockManager bm(8, 2);
    cache_prompt(bm, {1, 2, 3, 4}, 1);
    Sequence same = seq_of({1, 2, 3, 4}, 2);
    EXPECT_EQ(bm.match_prefix(same).size(), 1u);  // block [3, 4] holds the last token
    Sequence longer = seq_of({1, 2, 3, 4, 5}, 3);
    EXPECT_EQ(bm.match_prefix(longer).size(), 2u);
    Sequence salted = seq_of({1, 2, 3, 4, 5}, 4);
    salted.cache_salt = BlockManager::hash_salt("t");
    EXPECT_TRUE(bm.match_prefix(salted).empty());
}

TEST(BlockManager, CopyOnWriteOfASharedPartialBlock) {
    BlockManager bm(8, 4);
    Sequence a = seq_of({1, 2, 3, 4, 5, 6}, 1);
    std::vector<std::pair<int32_t, int32_t>> copies;
    bm.allocate(a, 6, {}, copies);
    bm.commit(a, 6);
    Sequence b;
    b.seq_id = 2;
    b.tokens = a.tokens;
    bm.fork(a, b);
    EXPECT_EQ(bm.ref_count(a.block_table[1]), 2);
    const int32_t shared = a.block_table[1];
    a.tokens.push_back(7);
    ASSERT_TRUE(bm.can_allocate(a, 1));
    bm.allocate(a, 1, {}, copies);  // writes position 6, in the shared second block
    ASSERT_EQ(copies.size(), 1u);
    EXPECT_EQ(copies[0].first, shared);
    EXPECT_NE(a.block_table[1], shared);
    EXPECT_EQ(bm.ref_count(shared), 1);
    EXPECT_EQ(b.block_table[1], shared);
    EXPECT_EQ(a.block_table[0], b.block_table[0]);  // the full block stays shared
    EXPECT_EQ(bm.ref_count(a.block_table[0]), 2);
    copies.clear();
    b.tokens.push_back(8);
    bm.allocate(b, 1, {}, copies);  // now b alone holds it: written in place
    EXPECT_TRUE(copies.empty());
    bm.release(a);
    bm.release(b);
    EXPECT_EQ(bm.num_used(), 0);
}

}  // namespace
}  // namespace peregrine

namespace peregrine {
namespace {

// vLLM-style prefix-cache events: full blocks only, grouped per sequence with the parent chain,
// evictions of findable blocks, nothing when not recording.
TEST(BlockManagerEvents, StoredBlocksChainAndEvictionsAreRemoved) {
    BlockManager bm(6, 2);
    cache_prompt(bm, {1, 2, 3, 4, 5}, 1);   // two full blocks and a partial one
    EXPECT_TRUE(bm.take_events().empty());  // not recording yet
    bm.set_recording(true);

    cache_prompt(bm, {7, 8, 9, 10, 11}, 2);
    std::vector<KvCacheEvent> ev = bm.take_events();
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].kind, KvCacheEvent::Kind::BlockStored);
    ASSERT_EQ(ev[0].block_hashes.size(), 2u);  // the partial block is not announced
    EXPECT_FALSE(ev[0].parent_block_hash.has_value());
    EXPECT_EQ(ev[0].token_ids, (std::vector<int32_t>{7, 8, 9, 10}));
    const uint64_t first = ev[0].block_hashes[0], second = ev[0].block_hashes[1];
    EXPECT_EQ(first, BlockManager::hash_block(0, 0, std::vector<int32_t>{7, 8}.data(), 2));
    EXPECT_EQ(second, BlockManager::hash_block(first, 0, std::vector<int32_t>{9, 10}.data(), 2));

    // A sequence sharing the first block: only its new blocks, chained to the shared one. The
    // pool holds 4 cached blocks and 2 free ones: its third new block evicts the least recently
    // used cached one (prompt 1's).
    Sequence s = seq_of({7, 8, 30, 31, 32, 33, 0}, 3);
    std::vector<std::pair<int32_t, int32_t>> copies;
    const auto hits = bm.match_prefix(s);
    ASSERT_EQ(hits.size(), 1u);
    bm.allocate(s, s.num_tokens() - 2, hits, copies);
    bm.commit(s, s.num_tokens());
    ev = bm.take_events();
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(ev[0].kind, KvCacheEvent::Kind::BlockRemoved);
    ASSERT_EQ(ev[0].block_hashes.size(), 1u);
    EXPECT_EQ(ev[1].kind, KvCacheEvent::Kind::BlockStored);
    EXPECT_EQ(ev[1].block_hashes.size(), 2u);
    EXPECT_EQ(ev[1].parent_block_hash, std::optional<uint64_t>(first));
    EXPECT_EQ(ev[1].token_ids, (std::vector<int32_t>{30, 31, 32, 33}));
    bm.release(s);
    EXPECT_TRUE(bm.take_events().empty());  // releasing keeps blocks findable: no event
}

}  // namespace
}  // namespace peregrine
