// The host tier of the prefix cache: which committed KV blocks have a copy in host memory, and
// in which slot. Bookkeeping only: the bytes live in the worker's host pool (Worker::
// init_host_kv_cache), slot s at s * kv_block_bytes.
//
// A slot is free, or holds one block: its hash, its parent's hash (none for a sequence's first
// block) and exactly the tokens the hash was computed from (verified on a lookup, as the device
// pool does). Held slots are evictable in the order of the shared eviction policy unless pinned:
// a slot read by an onload queued in the current step is pinned until the step's transfers are
// taken, so that no offload of the same step (issued before the onloads) overwrites it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "engine/eviction_policy.h"

namespace peregrine {

class HostBlockPool {
  public:
    HostBlockPool(int num_slots, int block_size, EvictionPolicy policy);

    int num_slots() const { return static_cast<int>(slots_.size()); }
    int num_used() const { return num_slots() - static_cast<int>(free_.size()); }
    uint64_t evictions() const { return evictions_; }

    // The slot holding the block `hash` with exactly `tokens` (block_size of them), or -1.
    int32_t find(uint64_t hash, const int32_t* tokens) const;
    bool contains(uint64_t hash) const { return index_.count(hash) > 0; }
    // A hit: one more use (LFU) and the latest use (LRU).
    void touch(int32_t slot);

    struct Stored {
        int32_t slot = -1;                // where the block's bytes go; -1: nothing to copy
        std::optional<uint64_t> evicted;  // the hash of the block evicted to make room
    };
    // Gives the block a slot, evicting the policy's victim when none is free. Nothing to copy
    // (slot -1) when the hash is held already (touched instead) or every held slot is pinned.
    // `uses` carries the block's use count over from the device pool (LFU).
    Stored store(uint64_t hash, std::optional<uint64_t> parent, const int32_t* tokens, uint64_t uses);

    void pin(int32_t slot);
    void unpin_all();

    uint64_t hash(int32_t slot) const { return slots_[slot].hash; }
    std::optional<uint64_t> parent(int32_t slot) const { return slots_[slot].parent; }
    const std::vector<int32_t>& tokens(int32_t slot) const { return slots_[slot].tokens; }
    uint64_t uses(int32_t slot) const { return slots_[slot].uses; }
    bool is_held(int32_t slot) const { return slots_[slot].held; }

  private:
    struct Slot {
        bool held = false;
        bool pinned = false;
        uint64_t hash = 0;
        std::optional<uint64_t> parent;
        std::vector<int32_t> tokens;
        uint64_t last_used = 0, uses = 0, stored_at = 0;
        EvictionKey key;  // position in evictable_ while there (held, not pinned)
    };

    int block_size_;
    EvictionPolicy policy_;
    std::vector<Slot> slots_;
    std::vector<int32_t> free_;  // a stack: slot 0 first
    std::set<EvictionKey> evictable_;
    std::unordered_map<uint64_t, int32_t> index_;  // hash -> slot
    std::vector<int32_t> pinned_;
    uint64_t clock_ = 0;
    uint64_t evictions_ = 0;
};

}  // namespace peregrine
