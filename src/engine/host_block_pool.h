// The host tier of the prefix cache: which committed KV blocks have a copy in host memory, and
// in which slot. Bookkeeping only: the bytes live in the worker's host pool (Worker::
// init_host_kv_cache), slot s at s * kv_block_bytes.
//
// A slot is free, or holds one block: its hash, its parent's hash (none for a sequence's first
// block) and exactly the tokens the hash was computed from (verified on a lookup, as the device
// pool does). Held slots are evictable in the order of the shared eviction policy unless pinned:
// a slot read by an onload queued in the current step is pinned until the step's transfers are
// taken, so that no offload of the same step (issued before the onloads) overwrites it.
//
// Swap preemption reserves slots outside the cache: a reserved slot holds a preempted
// sequence's block (full or partial), is neither findable nor evictable, and goes back to the
// free slots only when released (after the onload that reads it was issued). A disk read
// fills a reserved slot too, which `adopt` then makes a held one.
//
// The disk tier (--kv-offload-disk) keeps its bookkeeping in a second HostBlockPool over its
// file's slots: the same index, token check and eviction order (no reservations there).
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
    int num_reserved() const { return num_reserved_; }
    // Slots a reservation can take now: free ones plus evictable cached ones.
    int num_reservable() const { return static_cast<int>(free_.size() + evictable_.size()); }
    uint64_t evictions() const { return evictions_; }

    // The slot holding the block `hash` with exactly `tokens` (block_size of them), or -1.
    int32_t find(uint64_t hash, const int32_t* tokens) const;
    bool contains(uint64_t hash) const { return index_.count(hash) > 0; }
    // A hit: one more use (LFU) and the latest use (LRU).
    void touch(int32_t slot);

    struct Stored {
        int32_t slot = -1;                // where the block's bytes go; -1: nothing to copy
        std::optional<uint64_t> evicted;  // the hash of the block evicted to make room
        // What the slot knew of the evicted block (its bytes are still in the slot until the
        // new ones are copied in): what a spill to the tier below needs.
        std::optional<uint64_t> evicted_parent;
        std::vector<int32_t> evicted_tokens;
        uint64_t evicted_uses = 0;
        bool evicted_keyed = false;
    };
    // Gives the block a slot, evicting the policy's victim when none is free. Nothing to copy
    // (slot -1) when the hash is held already (touched instead) or every held slot is pinned.
    // `uses` carries the block's use count over from the device pool (LFU).
    // `keyed`: the block belongs to a conversation (evicted after anonymous ones).
    Stored store(uint64_t hash, std::optional<uint64_t> parent, const int32_t* tokens, uint64_t uses,
                 bool keyed = false);

    // A slot for a swapped-out block, taken from the free slots, else from the cache's victim
    // (`slot` -1 when every slot is reserved or pinned). Call num_reservable first.
    Stored reserve();
    void release(int32_t slot);  // a reserved slot back to the free ones
    // A reserved slot whose bytes now hold the block `hash` (a finished disk read) becomes a
    // held one, findable and evictable. The hash must not be held already.
    void adopt(int32_t slot, uint64_t hash, std::optional<uint64_t> parent, const std::vector<int32_t>& tokens,
               uint64_t uses, bool keyed);
    // Forgets a held, unpinned slot's block (its bytes turned out bad) and frees the slot.
    void drop(int32_t slot);
    void pin(int32_t slot);
    void unpin_all();

    uint64_t hash(int32_t slot) const { return slots_[slot].hash; }
    std::optional<uint64_t> parent(int32_t slot) const { return slots_[slot].parent; }
    const std::vector<int32_t>& tokens(int32_t slot) const { return slots_[slot].tokens; }
    uint64_t uses(int32_t slot) const { return slots_[slot].uses; }
    bool keyed(int32_t slot) const { return slots_[slot].keyed; }
    bool is_held(int32_t slot) const { return slots_[slot].held; }

  private:
    struct Slot {
        bool held = false;
        bool pinned = false;
        bool reserved = false;  // a swapped-out block's (not held: no hash, not findable)
        bool keyed = false;     // a conversation's block (prompt_cache_key)
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
    int num_reserved_ = 0;

    int32_t take_slot(Stored& out);  // a free slot, else the victim's (-1: none)
    // Fills a taken slot with a block (block_size tokens), findable and evictable.
    void hold(int32_t slot, uint64_t hash, std::optional<uint64_t> parent, const int32_t* tokens, uint64_t uses,
              bool keyed);
    EvictionKey key_of(int32_t slot) const;
};

}  // namespace peregrine
