#include "engine/host_block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace peregrine {

HostBlockPool::HostBlockPool(int num_slots, int block_size, EvictionPolicy policy)
    : block_size_(block_size), policy_(policy), slots_(num_slots) {
    PG_CHECK(num_slots >= 0 && block_size > 0);
    for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t HostBlockPool::find(uint64_t hash, const int32_t* tokens) const {
    const auto it = index_.find(hash);
    if (it == index_.end()) return -1;
    const Slot& s = slots_[it->second];
    if (!std::equal(s.tokens.begin(), s.tokens.end(), tokens)) return -1;  // a hash collision
    return it->second;
}

void HostBlockPool::touch(int32_t slot) {
    Slot& s = slots_[slot];
    PG_CHECK(s.held, "touching host slot ", slot, " which holds nothing");
    if (!s.pinned) evictable_.erase(s.key);
    s.last_used = ++clock_;
    ++s.uses;
    s.key = eviction_key(policy_, s.last_used, s.uses, s.stored_at, slot);
    if (!s.pinned) evictable_.insert(s.key);
}

HostBlockPool::Stored HostBlockPool::store(uint64_t hash, std::optional<uint64_t> parent, const int32_t* tokens,
                                           uint64_t uses) {
    Stored out;
    if (const auto it = index_.find(hash); it != index_.end()) {
        touch(it->second);
        return out;
    }
    int32_t slot;
    if (!free_.empty()) {
        slot = free_.back();
        free_.pop_back();
    } else {
        if (evictable_.empty()) return out;  // every slot is read this step
        slot = std::get<2>(*evictable_.begin());
        evictable_.erase(evictable_.begin());
        out.evicted = slots_[slot].hash;
        index_.erase(slots_[slot].hash);
        ++evictions_;
    }
    Slot& s = slots_[slot];
    s = Slot{};
    s.held = true;
    s.hash = hash;
    s.parent = parent;
    s.tokens.assign(tokens, tokens + block_size_);
    s.last_used = s.stored_at = ++clock_;
    s.uses = uses;
    s.key = eviction_key(policy_, s.last_used, s.uses, s.stored_at, slot);
    evictable_.insert(s.key);
    index_.emplace(hash, slot);
    out.slot = slot;
    return out;
}

void HostBlockPool::pin(int32_t slot) {
    Slot& s = slots_[slot];
    PG_CHECK(s.held, "pinning host slot ", slot, " which holds nothing");
    if (s.pinned) return;
    evictable_.erase(s.key);
    s.pinned = true;
    pinned_.push_back(slot);
}

void HostBlockPool::unpin_all() {
    for (int32_t slot : pinned_) {
        Slot& s = slots_[slot];
        s.pinned = false;
        s.key = eviction_key(policy_, s.last_used, s.uses, s.stored_at, slot);
        evictable_.insert(s.key);
    }
    pinned_.clear();
}

}  // namespace peregrine
