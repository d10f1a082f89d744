#include "engine/block_manager.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>

#include "core/error.h"

namespace peregrine {

EvictionPolicy eviction_policy_from_name(const std::string& name) {
    if (name == "lru") return EvictionPolicy::Lru;
    if (name == "lfu") return EvictionPolicy::Lfu;
    if (name == "fifo") return EvictionPolicy::Fifo;
    fail("unknown KV eviction policy '", name, "' (lru, lfu, fifo)");
}

BlockManager::BlockManager(int num_blocks, int block_size, EvictionPolicy policy, bool prefix_caching,
                           int num_host_slots, int num_disk_slots)
    : block_size_(block_size), policy_(policy), prefix_caching_(prefix_caching), blocks_(num_blocks) {
    PG_CHECK(num_blocks > 0 && block_size > 0 && num_host_slots >= 0 && num_disk_slots >= 0);
    PG_CHECK(prefix_caching || num_host_slots == 0, "a host tier needs prefix caching");
    PG_CHECK(num_host_slots > 0 || num_disk_slots == 0, "a disk tier needs a host tier");
    if (num_host_slots > 0) host_.emplace(num_host_slots, block_size, policy);
    if (num_disk_slots > 0) disk_.emplace(num_disk_slots, block_size, policy);
    // A stack: block 0 is handed out first.
    for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

uint64_t BlockManager::hash_block(uint64_t parent, uint64_t salt, const int32_t* tokens, int n) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, &parent, sizeof(parent));
    XXH3_64bits_update(&st, &salt, sizeof(salt));
    XXH3_64bits_update(&st, tokens, static_cast<size_t>(n) * sizeof(int32_t));
    return XXH3_64bits_digest(&st);
}

uint64_t BlockManager::hash_salt(const std::string& salt) {
    return salt.empty() ? 0 : XXH3_64bits(salt.data(), salt.size()) | 1;
}

std::vector<PrefixHit> BlockManager::match_prefix(const Sequence& seq) const {
    std::vector<PrefixHit> hits;
    if (!prefix_caching_) return hits;
    const int full = (seq.num_tokens() - 1) / block_size_;
    uint64_t parent = 0;
    for (int i = 0; i < full; ++i) {
        const int32_t* toks = seq.tokens.data() + i * block_size_;
        const uint64_t h = hash_block(parent, seq.cache_salt, toks, block_size_);
        PrefixHit hit;
        if (auto it = cached_.find(h); it != cached_.end()) {
            const Block& b = blocks_[it->second];
            if (!std::equal(b.tokens.begin(), b.tokens.end(), toks)) break;  // a hash collision
            hit.block = it->second;
        } else if (host_ && (hit.host_slot = host_->find(h, toks)) >= 0) {
        } else if (const auto l = loading_.find(h);
                   l != loading_.end() && std::equal(l->second.tokens.begin(), l->second.tokens.end(), toks)) {
            hit.loading = true;
        } else if (!disk_ || (hit.disk_slot = disk_->find(h, toks)) < 0) {
            break;
        }
        hits.push_back(hit);
        parent = h;
    }
    return hits;
}

bool BlockManager::can_allocate(const Sequence& seq, int num_new, const std::vector<PrefixHit>& hits) const {
    int fresh = 0;
    if (seq.block_table.empty()) {
        const int computed = static_cast<int>(hits.size()) * block_size_;
        fresh = (computed + num_new + block_size_ - 1) / block_size_ - static_cast<int>(hits.size());
        // Device hits sitting in the evictable set stop being available once adopted; host hits
        // each take a block.
        for (const PrefixHit& h : hits) fresh += h.on_host() || blocks_[h.block].ref == 0;
    } else {
        const int held = static_cast<int>(seq.block_table.size());
        fresh = std::max(0, (seq.num_computed + num_new + block_size_ - 1) / block_size_ - held);
        // A shared block about to be written needs a private copy.
        for (int i = seq.num_computed / block_size_; i < held; ++i) fresh += blocks_[seq.block_table[i]].ref > 1;
    }
    return fresh <= num_available();
}

void BlockManager::allocate(Sequence& seq, int num_new, const std::vector<PrefixHit>& hits,
                            std::vector<std::pair<int32_t, int32_t>>& copies) {
    if (seq.block_table.empty() && !hits.empty()) {
        // Device hits are adopted before any block is taken (taking one may evict a later
        // device hit otherwise), and host hits are pinned (an offload may evict them otherwise).
        seq.block_table.assign(hits.size(), -1);
        for (size_t i = 0; i < hits.size(); ++i) {
            if (hits[i].on_host()) {
                PG_CHECK(host_ && host_->is_held(hits[i].host_slot), "host hit on an empty slot");
                host_->pin(hits[i].host_slot);
                continue;
            }
            const int32_t b = hits[i].block;
            add_ref(b);
            blocks_[b].uses++;
            blocks_[b].keyed |= seq.keyed;
            seq.block_table[i] = b;
        }
        for (size_t i = 0; i < hits.size(); ++i) {
            if (!hits[i].on_host()) continue;
            const int32_t slot = hits[i].host_slot;
            const int32_t b = take_block();
            Block& blk = blocks_[b];
            blk.hashed = true;
            blk.hash = host_->hash(slot);
            blk.parent = host_->parent(slot);
            blk.tokens = host_->tokens(slot);
            blk.uses = host_->uses(slot) + 1;
            blk.keyed = host_->keyed(slot) || seq.keyed;
            blk.cached_at = ++clock_;
            // Findable at once: the onload is issued before any step that reads it.
            if (cached_.emplace(blk.hash, b).second) {
                blk.cached = true;
                if (recording_) record_stored(blk.hash, blk.parent, blk.tokens, KvCacheEvent::Medium::Gpu);
            }
            host_->touch(slot);
            pending_.onloads.emplace_back(slot, b);
            seq.block_table[i] = b;
        }
        seq.num_computed = static_cast<int>(hits.size()) * block_size_;
    }
    const int needed = (seq.num_computed + num_new + block_size_ - 1) / block_size_;
    // Copy-on-write for shared blocks in the range this step writes.
    for (int i = seq.num_computed / block_size_; i < static_cast<int>(seq.block_table.size()); ++i) {
        const int32_t b = seq.block_table[i];
        if (blocks_[b].ref > 1) {
            const int32_t copy = take_block();
            copies.emplace_back(b, copy);
            drop_ref(b);
            seq.block_table[i] = copy;
        }
    }
    while (static_cast<int>(seq.block_table.size()) < needed) seq.block_table.push_back(take_block());
}

void BlockManager::commit(Sequence& seq, int num_computed) {
    PG_CHECK(num_computed <= static_cast<int>(seq.block_table.size()) * block_size_);
    const int old_full = seq.num_computed / block_size_;
    const int new_full = num_computed / block_size_;
    seq.num_computed = num_computed;
    if (!prefix_caching_) return;
    for (int i = old_full; i < new_full; ++i) {
        Block& blk = blocks_[seq.block_table[i]];
        blk.keyed |= seq.keyed;
        if (blk.hashed) continue;  // adopted from the cache, or shared with a forked sibling
        const uint64_t parent = i == 0 ? 0 : blocks_[seq.block_table[i - 1]].hash;
        const int32_t* toks = seq.tokens.data() + i * block_size_;
        blk.hash = hash_block(parent, seq.cache_salt, toks, block_size_);
        blk.tokens.assign(toks, toks + block_size_);
        blk.parent = i == 0 ? std::nullopt : std::optional<uint64_t>(parent);
        blk.hashed = true;
        blk.cached_at = ++clock_;
        if (cached_.emplace(blk.hash, seq.block_table[i]).second) {
            blk.cached = true;
            if (recording_) record_stored(blk.hash, blk.parent, blk.tokens, KvCacheEvent::Medium::Gpu);
        }
    }
}

void BlockManager::fork(const Sequence& parent, Sequence& child) {
    PG_CHECK(child.block_table.empty());
    child.block_table = parent.block_table;
    child.num_computed = parent.num_computed;
    for (int32_t b : child.block_table) add_ref(b);
}

void BlockManager::release(Sequence& seq) {
    // Tail first, so that under LRU the ends of sequences are evicted before shared prefixes.
    for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) drop_ref(*it);
    seq.block_table.clear();
    seq.num_computed = 0;
    if (const auto it = swapped_.find(seq.seq_id); it != swapped_.end()) {
        for (const Swapped& sw : it->second) host_->release(sw.slot);
        swapped_.erase(it);
    }
}

bool BlockManager::swap_out(Sequence& seq) {
    const int n = (seq.num_computed + block_size_ - 1) / block_size_;
    if (!host_ || n == 0 || n > host_->num_reservable()) return false;
    PG_CHECK(!is_swapped(seq) && n <= static_cast<int>(seq.block_table.size()));
    std::vector<Swapped> out;
    for (int i = 0; i < n; ++i) {
        const HostBlockPool::Stored st = host_->reserve();
        PG_CHECK(st.slot >= 0, "host slot count changed while swapping out");
        forget_host_victim(st);
        const int32_t b = seq.block_table[i];
        const Block& blk = blocks_[b];
        out.push_back({st.slot, blk.hashed, blk.keyed, blk.hash, blk.uses, blk.parent, blk.tokens});
        pending_.offloads.emplace_back(b, st.slot);
    }
    const int computed = seq.num_computed;
    release(seq);  // before registering the slots, which release would free
    seq.num_computed = computed;
    swapped_.emplace(seq.seq_id, std::move(out));
    ++stats_.swap_outs;
    stats_.swapped_out_blocks += n;
    return true;
}

bool BlockManager::can_swap_in(const Sequence& seq, int num_new) const {
    return (seq.num_computed + num_new + block_size_ - 1) / block_size_ <= num_available();
}

void BlockManager::swap_in(Sequence& seq) {
    const auto it = swapped_.find(seq.seq_id);
    PG_CHECK(it != swapped_.end() && seq.block_table.empty(), "swapping in a sequence that is not swapped out");
    std::vector<Swapped> parts = std::move(it->second);
    swapped_.erase(it);
    for (Swapped& sw : parts) {
        const int32_t b = take_block();
        Block& blk = blocks_[b];
        blk.keyed = sw.keyed;
        blk.uses = sw.uses;
        if (sw.hashed) {  // commit() skips hashed blocks; the next block's parent is read from it
            blk.hashed = true;
            blk.hash = sw.hash;
            blk.parent = sw.parent;
            blk.tokens = std::move(sw.tokens);
            blk.cached_at = ++clock_;
            if (cached_.emplace(blk.hash, b).second) {
                blk.cached = true;
                if (recording_) record_stored(blk.hash, blk.parent, blk.tokens, KvCacheEvent::Medium::Gpu);
            }
        }
        pending_.onloads.emplace_back(sw.slot, b);
        swapped_in_slots_.push_back(sw.slot);
        seq.block_table.push_back(b);
    }
    stats_.swapped_in_blocks += parts.size();
}

void BlockManager::forget_host_victim(const HostBlockPool::Stored& st) {
    if (!st.evicted) return;
    // An offload of this batch into the same slot is superseded (no onload reads it: pinned).
    const size_t superseded =
        std::erase_if(pending_.offloads, [&](const std::pair<int32_t, int32_t>& o) { return o.second == st.slot; });
    if (recording_) record_removed(*st.evicted, KvCacheEvent::Medium::Cpu);
    // A superseded offload never brought the victim's bytes: nothing true to spill.
    if (disk_ && superseded == 0) spill(st);
}

void BlockManager::spill(const HostBlockPool::Stored& st) {
    const HostBlockPool::Stored ds =
        disk_->store(*st.evicted, st.evicted_parent, st.evicted_tokens.data(), st.evicted_uses, st.evicted_keyed);
    if (ds.slot < 0) return;  // on disk already, or every disk slot is read this step
    if (ds.evicted) {
        std::erase_if(pending_.spills, [&](const DiskCopy& c) { return c.disk_slot == ds.slot; });
        if (recording_) record_removed(*ds.evicted, KvCacheEvent::Medium::Disk);
    }
    pending_.spills.push_back({st.slot, ds.slot, *st.evicted});
    if (recording_) record_stored(*st.evicted, st.evicted_parent, st.evicted_tokens, KvCacheEvent::Medium::Disk);
}

int BlockManager::prefetch(const std::vector<PrefixHit>& hits) {
    if (!disk_) return 0;
    // The chain's host and disk blocks stay where they are while host slots are taken.
    for (const PrefixHit& h : hits) {
        if (h.on_host()) host_->pin(h.host_slot);
        if (h.disk_slot >= 0) disk_->pin(h.disk_slot);
    }
    int started = 0;
    for (const PrefixHit& h : hits) {
        if (h.disk_slot < 0) continue;
        const uint64_t hash = disk_->hash(h.disk_slot);
        if (host_->num_reservable() == 0 || loading_.count(hash)) break;
        const HostBlockPool::Stored st = host_->reserve();
        PG_CHECK(st.slot >= 0, "host slot count changed while prefetching");
        forget_host_victim(st);  // may spill the victim: the chain's disk slots are pinned
        disk_->touch(h.disk_slot);
        loading_.emplace(hash, Loading{st.slot, h.disk_slot, disk_->parent(h.disk_slot), disk_->tokens(h.disk_slot),
                                       disk_->uses(h.disk_slot), disk_->keyed(h.disk_slot)});
        pending_.reads.push_back({st.slot, h.disk_slot, hash});
        ++started;
    }
    return started;
}

void BlockManager::finish_disk_read(uint64_t hash, bool ok) {
    const auto it = loading_.find(hash);
    PG_CHECK(it != loading_.end(), "a disk read nobody asked for");
    Loading l = std::move(it->second);
    loading_.erase(it);
    if (ok && !host_->contains(hash)) {
        host_->adopt(l.host_slot, hash, l.parent, l.tokens, l.uses, l.keyed);
        if (recording_) record_stored(hash, l.parent, l.tokens, KvCacheEvent::Medium::Cpu);
    } else {
        host_->release(l.host_slot);
    }
    if (!ok) {
        ++stats_.disk_read_failures;
        drop_disk(l.disk_slot, hash);
    }
}

void BlockManager::finish_disk_write(int32_t disk_slot, uint64_t hash, bool ok) {
    if (ok) return;
    ++stats_.disk_write_failures;
    drop_disk(disk_slot, hash);
}

void BlockManager::drop_disk(int32_t disk_slot, uint64_t hash) {
    if (!disk_->is_held(disk_slot) || disk_->hash(disk_slot) != hash) return;  // reused since
    disk_->drop(disk_slot);
    if (recording_) record_removed(hash, KvCacheEvent::Medium::Disk);
}

EvictionKey BlockManager::eviction_key(int32_t b) const {
    const Block& blk = blocks_[b];
    return peregrine::eviction_key(policy_, blk.last_used, blk.uses, blk.cached_at, b, blk.keyed);
}

void BlockManager::add_ref(int32_t b) {
    Block& blk = blocks_[b];
    if (blk.ref == 0 && blk.cached) evictable_.erase(blk.evict_key);
    PG_CHECK(blk.ref > 0 || blk.cached, "adopting block ", b, " which is neither live nor cached");
    ++blk.ref;
}

void BlockManager::drop_ref(int32_t b) {
    Block& blk = blocks_[b];
    PG_CHECK(blk.ref > 0, "block ", b, " released more often than taken");
    if (--blk.ref > 0) return;
    blk.last_used = ++clock_;
    if (blk.cached) {
        blk.evict_key = eviction_key(b);
        evictable_.insert(blk.evict_key);
    } else {
        blk.hashed = false;
        blk.tokens.clear();
        free_.push_back(b);
    }
}

// Consecutive blocks of one sequence stored in one medium extend the last event, as vLLM
// groups them.
void BlockManager::record_stored(uint64_t hash, std::optional<uint64_t> parent, const std::vector<int32_t>& tokens,
                                 KvCacheEvent::Medium medium) {
    if (!events_.empty() && parent) {
        KvCacheEvent& last = events_.back();
        if (last.kind == KvCacheEvent::Kind::BlockStored && last.medium == medium &&
            last.block_hashes.back() == *parent) {
            last.block_hashes.push_back(hash);
            last.token_ids.insert(last.token_ids.end(), tokens.begin(), tokens.end());
            return;
        }
    }
    KvCacheEvent e;
    e.kind = KvCacheEvent::Kind::BlockStored;
    e.medium = medium;
    e.block_hashes.push_back(hash);
    e.parent_block_hash = parent;
    e.token_ids = tokens;
    events_.push_back(std::move(e));
}

void BlockManager::record_removed(uint64_t hash, KvCacheEvent::Medium medium) {
    KvCacheEvent e;
    e.kind = KvCacheEvent::Kind::BlockRemoved;
    e.medium = medium;
    e.block_hashes.push_back(hash);
    events_.push_back(std::move(e));
}

void BlockManager::offload(int32_t b) {
    const Block& blk = blocks_[b];
    const HostBlockPool::Stored st = host_->store(blk.hash, blk.parent, blk.tokens.data(), blk.uses, blk.keyed);
    if (st.slot < 0) return;  // held there already, or every slot is being read this step
    forget_host_victim(st);
    pending_.offloads.emplace_back(b, st.slot);
    if (recording_) record_stored(blk.hash, blk.parent, blk.tokens, KvCacheEvent::Medium::Cpu);
}

BlockTransfers BlockManager::take_transfers() {
    BlockTransfers t = std::exchange(pending_, {});
    if (host_) host_->unpin_all();
    if (disk_) disk_->unpin_all();
    for (int32_t slot : swapped_in_slots_) host_->release(slot);
    swapped_in_slots_.clear();
    stats_.disk_writes += t.spills.size();
    stats_.disk_reads += t.reads.size();
    stats_.offloaded_blocks += t.offloads.size();
    stats_.onloaded_blocks += t.onloads.size();
    return t;
}

int32_t BlockManager::take_block() {
    int32_t b;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else {
        PG_CHECK(!evictable_.empty(), "out of KV blocks: can_allocate was not checked");
        b = std::get<2>(*evictable_.begin());
        evictable_.erase(evictable_.begin());
        cached_.erase(blocks_[b].hash);
        ++stats_.evictions;
        if (recording_) record_removed(blocks_[b].hash, KvCacheEvent::Medium::Gpu);
        if (host_) offload(b);  // reads the block's K/V before this batch writes it
    }
    Block& blk = blocks_[b];
    blk = Block{};
    blk.ref = 1;
    return b;
}

}  // namespace peregrine
