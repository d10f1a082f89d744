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
    s.key = key_of(slot);
    if (!s.pinned) evictable_.insert(s.key);
}

EvictionKey HostBlockPool::key_of(int32_t slot) const {
    const Slot& s = slots_[slot];
    return eviction_key(policy_, s.last_used, s.uses, s.stored_at, slot, s.keyed);
}

int32_t HostBlockPool::take_slot(Stored& out) {
    if (!free_.empty()) {
        const int32_t slot = free_.back();
        free_.pop_back();
        return slot;
    }
    if (evictable_.empty()) return -1;  // every slot is reserved or read this step
    const int32_t slot = std::get<2>(*evictable_.begin());
    evictable_.erase(evictable_.begin());
    Slot& victim = slots_[slot];
    out.evicted = victim.hash;
    out.evicted_parent = victim.parent;
    out.evicted_tokens = std::move(victim.tokens);
    out.evicted_uses = victim.uses;
    out.evicted_keyed = victim.keyed;
    index_.erase(victim.hash);
    ++evictions_;
    return slot;
}

HostBlockPool::Stored HostBlockPool::reserve() {
    Stored out;
    const int32_t slot = take_slot(out);
    if (slot < 0) return out;
    slots_[slot] = Slot{};
    slots_[slot].reserved = true;
    ++num_reserved_;
    out.slot = slot;
    return out;
}

void HostBlockPool::release(int32_t slot) {
    PG_CHECK(slots_[slot].reserved, "releasing host slot ", slot, " which is not reserved");
    slots_[slot] = Slot{};
    --num_reserved_;
    free_.push_back(slot);
}

void HostBlockPool::adopt(int32_t slot, uint64_t hash, std::optional<uint64_t> parent,
                          const std::vector<int32_t>& tokens, uint64_t uses, bool keyed) {
    PG_CHECK(slots_[slot].reserved && !index_.count(hash), "adopting host slot ", slot);
    PG_CHECK(static_cast<int>(tokens.size()) == block_size_);
    --num_reserved_;
    hold(slot, hash, parent, tokens.data(), uses, keyed);
}

void HostBlockPool::hold(int32_t slot, uint64_t hash, std::optional<uint64_t> parent, const int32_t* tokens,
                         uint64_t uses, bool keyed) {
    Slot& s = slots_[slot];
    s = Slot{};
    s.held = true;
    s.hash = hash;
    s.parent = parent;
    s.tokens.assign(tokens, tokens + block_size_);
    s.last_used = s.stored_at = ++clock_;
    s.uses = uses;
    s.keyed = keyed;
    s.key = key_of(slot);
    evictable_.insert(s.key);
    index_.emplace(hash, slot);
}

void HostBlockPool::drop(int32_t slot) {
    Slot& s = slots_[slot];
    PG_CHECK(s.held && !s.pinned, "dropping host slot ", slot);
    evictable_.erase(s.key);
    index_.erase(s.hash);
    s = Slot{};
    free_.push_back(slot);
}

HostBlockPool::Stored HostBlockPool::store(uint64_t hash, std::optional<uint64_t> parent, const int32_t* tokens,
                                           uint64_t uses, bool keyed) {
    Stored out;
    if (const auto it = index_.find(hash); it != index_.end()) {
        Slot& held = slots_[it->second];
        if (keyed && !held.keyed) {  // a conversation now owns it: re-sort before the touch
            if (!held.pinned) evictable_.erase(held.key);
            held.keyed = true;
            held.key = key_of(it->second);
            if (!held.pinned) evictable_.insert(held.key);
        }
        touch(it->second);
        return out;
    }
    const int32_t slot = take_slot(out);
    if (slot < 0) return out;
    hold(slot, hash, parent, tokens, uses, keyed);
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
        s.key = key_of(slot);
        evictable_.insert(s.key);
    }
    pinned_.clear();
}

}  // namespace peregrine
