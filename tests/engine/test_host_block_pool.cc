// The host tier's bookkeeping: HostBlockPool alone (index, verification, eviction order,
// pinning), then BlockManager with a host tier (offload on eviction, host hits, onloads, the
// copy order, events).
#include <gtest/gtest.h>

#include "engine/block_manager.h"
#include "engine/host_block_pool.h"
#include "support/block_sequences.h"

namespace peregrine {
namespace {

std::vector<int32_t> toks(int32_t a) {
    return {a, a};
}  // one block of 2 tokens

TEST(HostBlockPool, FindsOnlyVerifiedBlocks) {
    HostBlockPool pool(4, 2, EvictionPolicy::Lru);
    const auto t = toks(5);
    const HostBlockPool::Stored st = pool.store(111, std::nullopt, t.data(), 0);
    ASSERT_GE(st.slot, 0);
    EXPECT_FALSE(st.evicted);
    EXPECT_EQ(pool.find(111, t.data()), st.slot);
    const auto other = toks(6);
    EXPECT_EQ(pool.find(111, other.data()), -1);  // same hash, other tokens: a collision
    EXPECT_EQ(pool.find(222, t.data()), -1);
    EXPECT_EQ(pool.num_used(), 1);
    // The same hash again: nothing to copy.
    EXPECT_EQ(pool.store(111, std::nullopt, t.data(), 0).slot, -1);
    EXPECT_EQ(pool.num_used(), 1);
    EXPECT_EQ(pool.parent(st.slot), std::nullopt);
    const auto t2 = toks(7);
    const int32_t s2 = pool.store(333, 111, t2.data(), 0).slot;
    EXPECT_EQ(pool.parent(s2), std::optional<uint64_t>(111));
    EXPECT_EQ(pool.tokens(s2), t2);
}

// Stores blocks 1, 2, 3 into a pool of 3, touches 1 twice and 3 once, then stores block 4:
// which hash is evicted.
uint64_t victim(EvictionPolicy p) {
    HostBlockPool pool(3, 2, p);
    int32_t slot[4];
    for (int32_t b = 1; b <= 3; ++b) slot[b] = pool.store(b, std::nullopt, toks(b).data(), 0).slot;
    pool.touch(slot[1]);
    pool.touch(slot[1]);
    pool.touch(slot[3]);
    const HostBlockPool::Stored st = pool.store(4, std::nullopt, toks(4).data(), 0);
    EXPECT_GE(st.slot, 0);
    EXPECT_EQ(pool.evictions(), 1u);
    EXPECT_TRUE(st.evicted.has_value());
    EXPECT_FALSE(pool.contains(*st.evicted));
    EXPECT_TRUE(pool.contains(4));
    return st.evicted.value_or(0);
}

TEST(HostBlockPool, EvictionPolicies) {
    EXPECT_EQ(victim(EvictionPolicy::Lru), 2u);   // least recently used
    EXPECT_EQ(victim(EvictionPolicy::Lfu), 2u);   // fewest uses
    EXPECT_EQ(victim(EvictionPolicy::Fifo), 1u);  // stored first, however often used
}

TEST(HostBlockPool, LfuCarriesTheDeviceUseCount) {
    HostBlockPool pool(2, 2, EvictionPolicy::Lfu);
    pool.store(1, std::nullopt, toks(1).data(), 9);  // used often on the device
    pool.store(2, std::nullopt, toks(2).data(), 0);
    EXPECT_EQ(pool.store(3, std::nullopt, toks(3).data(), 0).evicted, std::optional<uint64_t>(2));
}

TEST(HostBlockPool, PinnedSlotsAreNeverEvicted) {
    HostBlockPool pool(2, 2, EvictionPolicy::Lru);
    const int32_t a = pool.store(1, std::nullopt, toks(1).data(), 0).slot;
    const int32_t b = pool.store(2, std::nullopt, toks(2).data(), 0).slot;
    pool.pin(a);  // the oldest, the LRU victim otherwise
    HostBlockPool::Stored st = pool.store(3, std::nullopt, toks(3).data(), 0);
    EXPECT_EQ(st.slot, b);
    EXPECT_EQ(st.evicted, std::optional<uint64_t>(2));
    pool.pin(b);
    st = pool.store(4, std::nullopt, toks(4).data(), 0);  // everything pinned: nothing stored
    EXPECT_EQ(st.slot, -1);
    EXPECT_FALSE(pool.contains(4));
    pool.unpin_all();
    st = pool.store(4, std::nullopt, toks(4).data(), 0);
    EXPECT_EQ(st.slot, a);  // pinned slot kept its age: it is the oldest again
}

// Computes and releases a prompt (every block full and hashed).
void cache_prompt(BlockManager& bm, const std::vector<int32_t>& tokens, uint64_t id) {
    Sequence s = seq_of(tokens, id);
    std::vector<std::pair<int32_t, int32_t>> copies;
    const auto hits = bm.match_prefix(s);
    ASSERT_TRUE(bm.can_allocate(s, s.num_tokens() - static_cast<int>(hits.size()) * bm.block_size(), hits));
    bm.allocate(s, s.num_tokens() - static_cast<int>(hits.size()) * bm.block_size(), hits, copies);
    bm.commit(s, s.num_tokens());
    bm.release(s);
}

TEST(BlockManagerHostTier, EvictedBlocksAreOffloadedAndComeBack) {
    BlockManager bm(2, 2, EvictionPolicy::Lru, true, 4);
    bm.set_recording(true);
    cache_prompt(bm, {1, 1, 2, 2}, 1);  // fills the device pool: 2 hashed blocks
    EXPECT_TRUE(bm.take_transfers().empty());
    const uint64_t h1 = bm.block_hash(0), h2 = bm.block_hash(1);
    bm.take_events();
    cache_prompt(bm, {3, 3, 4, 4}, 2);  // evicts both
    BlockTransfers t = bm.take_transfers();
    ASSERT_EQ(t.offloads.size(), 2u);
    EXPECT_TRUE(t.onloads.empty());
    EXPECT_EQ(bm.stats().evictions, 2u);
    EXPECT_EQ(bm.host()->num_used(), 2);
    // Events: each eviction is a BlockRemoved GPU then a BlockStored CPU with its parent. LRU
    // evicts a released sequence's tail first: h2, then h1.
    std::vector<KvCacheEvent> ev = bm.take_events();
    ASSERT_GE(ev.size(), 4u);
    EXPECT_EQ(ev[0].kind, KvCacheEvent::Kind::BlockRemoved);
    EXPECT_EQ(ev[0].medium, KvCacheEvent::Medium::Gpu);
    EXPECT_EQ(ev[0].block_hashes, std::vector<uint64_t>{h2});
    EXPECT_EQ(ev[1].kind, KvCacheEvent::Kind::BlockStored);
    EXPECT_EQ(ev[1].medium, KvCacheEvent::Medium::Cpu);
    EXPECT_EQ(ev[1].block_hashes, std::vector<uint64_t>{h2});
    EXPECT_EQ(ev[1].parent_block_hash, std::optional<uint64_t>(h1));
    EXPECT_EQ(ev[2].kind, KvCacheEvent::Kind::BlockRemoved);
    EXPECT_EQ(ev[2].block_hashes, std::vector<uint64_t>{h1});
    EXPECT_EQ(ev[3].medium, KvCacheEvent::Medium::Cpu);
    EXPECT_EQ(ev[3].block_hashes, std::vector<uint64_t>{h1});
    EXPECT_EQ(ev[3].parent_block_hash, std::nullopt);

    // The first prompt again: both blocks are host hits (the last token is never a hit).
    Sequence again = seq_of({1, 1, 2, 2, 9}, 3);
    const auto hits = bm.match_prefix(again);
    ASSERT_EQ(hits.size(), 2u);
    EXPECT_TRUE(hits[0].on_host() && hits[1].on_host());
    EXPECT_FALSE(bm.can_allocate(again, 1, hits));  // 2 blocks for the hits + 1 new = 3 > 2
    Sequence shorter = seq_of({1, 1, 2, 2}, 4);
    const auto hits2 = bm.match_prefix(shorter);
    ASSERT_EQ(hits2.size(), 1u);
    ASSERT_TRUE(bm.can_allocate(shorter, 2, hits2));
    std::vector<std::pair<int32_t, int32_t>> copies;
    bm.allocate(shorter, 2, hits2, copies);
    EXPECT_EQ(shorter.num_computed, 2);
    t = bm.take_transfers();
    // The hit's block evicted one of prompt 2's blocks (offloaded first), then its onload.
    ASSERT_EQ(t.onloads.size(), 1u);
    EXPECT_EQ(t.onloads[0].second, shorter.block_table[0]);
    EXPECT_TRUE(bm.is_cached(shorter.block_table[0]));
    EXPECT_EQ(bm.block_hash(shorter.block_table[0]), h1);
    EXPECT_EQ(t.offloads.size(), 2u);  // prompt 2's blocks, both taken for this sequence
    EXPECT_EQ(bm.stats().onloaded_blocks, 1u);
    bm.release(shorter);
    EXPECT_EQ(bm.num_used(), 0);
}

TEST(BlockManagerHostTier, DeviceAndHostHitsInterleaveInOneChain) {
    // Block 2 of the prompt stays on the device while block 1 moves to the host tier.
    BlockManager bm(3, 2, EvictionPolicy::Fifo, true, 4);
    cache_prompt(bm, {1, 1, 2, 2}, 1);
    bm.take_transfers();
    cache_prompt(bm, {5, 5, 6, 6}, 2);  // a free block, then FIFO evicts the prompt's first block only
    BlockTransfers t = bm.take_transfers();
    ASSERT_EQ(t.offloads.size(), 1u);
    Sequence again = seq_of({1, 1, 2, 2, 3}, 3);
    const auto hits = bm.match_prefix(again);
    ASSERT_EQ(hits.size(), 2u);
    EXPECT_TRUE(hits[0].on_host());
    EXPECT_FALSE(hits[1].on_host());
    ASSERT_TRUE(bm.can_allocate(again, 1, hits));
    std::vector<std::pair<int32_t, int32_t>> copies;
    bm.allocate(again, 1, hits, copies);
    // The device hit was adopted before the host hit took a block: it is still in the table.
    EXPECT_EQ(again.block_table[1], hits[1].block);
    t = bm.take_transfers();
    ASSERT_EQ(t.onloads.size(), 1u);
    EXPECT_EQ(t.onloads[0], std::make_pair(hits[0].host_slot, again.block_table[0]));
    for (const auto& [blk, slot] : t.offloads) EXPECT_NE(slot, hits[0].host_slot) << "overwrote a slot being read";
    bm.release(again);
    EXPECT_EQ(bm.num_used(), 0);
}

TEST(BlockManagerHostTier, HostHitsArePinnedAgainstTheSameBatchsOffloads) {
    // A host tier of 1 slot holding the hit: the offloads this allocation causes must not take it.
    BlockManager bm(2, 2, EvictionPolicy::Lru, true, 1);
    bm.set_recording(true);
    cache_prompt(bm, {1, 1}, 1);
    cache_prompt(bm, {2, 2, 3, 3}, 2);  // evicts {1,1} to the host slot
    bm.take_transfers();
    ASSERT_EQ(bm.host()->num_used(), 1);
    Sequence again = seq_of({1, 1, 4}, 3);
    const auto hits = bm.match_prefix(again);
    ASSERT_EQ(hits.size(), 1u);
    ASSERT_TRUE(hits[0].on_host());
    std::vector<std::pair<int32_t, int32_t>> copies;
    ASSERT_TRUE(bm.can_allocate(again, 1, hits));
    bm.take_events();
    bm.allocate(again, 1, hits, copies);  // evicts {2,2} and {3,3}: no slot for them
    const BlockTransfers t = bm.take_transfers();
    EXPECT_TRUE(t.offloads.empty());
    ASSERT_EQ(t.onloads.size(), 1u);
    EXPECT_EQ(bm.host()->num_used(), 1);
    Sequence probe = seq_of({1, 1, 0}, 4);
    EXPECT_EQ(bm.match_prefix(probe).size(), 1u);
    for (const KvCacheEvent& e : bm.take_events())
        EXPECT_FALSE(e.kind == KvCacheEvent::Kind::BlockRemoved && e.medium == KvCacheEvent::Medium::Cpu);
    bm.release(again);
    // {1,1} is evicted from the device again: the host holds it already, nothing to copy.
    cache_prompt(bm, {7, 7, 8, 8}, 5);
    EXPECT_TRUE(bm.take_transfers().offloads.empty());
    bm.take_events();
    // Unpinned now: the next offloads take its slot (BlockRemoved CPU); the second supersedes
    // the first (one slot), so one copy is left.
    cache_prompt(bm, {9, 9, 10, 10}, 6);
    const BlockTransfers t2 = bm.take_transfers();
    ASSERT_EQ(t2.offloads.size(), 1u);
    bool removed_cpu = false;
    for (const KvCacheEvent& e : bm.take_events())
        removed_cpu |= e.kind == KvCacheEvent::Kind::BlockRemoved && e.medium == KvCacheEvent::Medium::Cpu;
    EXPECT_TRUE(removed_cpu);
    EXPECT_EQ(bm.host()->evictions(), bm.host_evictions());
}

TEST(BlockManagerHostTier, NoTierMeansForgotten) {
    BlockManager bm(2, 2);
    cache_prompt(bm, {1, 1, 2, 2}, 1);
    cache_prompt(bm, {3, 3, 4, 4}, 2);
    EXPECT_TRUE(bm.take_transfers().empty());
    EXPECT_EQ(bm.host(), nullptr);
    Sequence again = seq_of({1, 1, 2, 2, 9}, 3);
    EXPECT_TRUE(bm.match_prefix(again).empty());
}

}  // namespace
}  // namespace peregrine
