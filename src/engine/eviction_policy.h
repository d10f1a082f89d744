// The prefix cache's eviction order, shared by the device pool (BlockManager) and the host tier
// (HostBlockPool): a block's key orders it among the evictable ones, smallest first out.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

namespace peregrine {

enum class EvictionPolicy { Lru, Lfu, Fifo };
EvictionPolicy eviction_policy_from_name(const std::string& name);  // "lru" | "lfu" | "fifo"

// (primary, tie-break, block or slot index).
using EvictionKey = std::tuple<uint64_t, uint64_t, int32_t>;

// Added to the primary of a block that belongs to a conversation (a request's
// prompt_cache_key): every anonymous block goes first. Clocks and use counts stay far below it.
inline constexpr uint64_t kKeyedEvictionClass = uint64_t{1} << 62;

// LRU: last use; LFU: (uses, last use); FIFO: when it was stored. `keyed`: a conversation's
// block, ordered after every anonymous one and by the policy among its own kind.
inline EvictionKey eviction_key(EvictionPolicy policy, uint64_t last_used, uint64_t uses, uint64_t stored_at,
                                int32_t index, bool keyed = false) {
    const uint64_t cls = keyed ? kKeyedEvictionClass : 0;
    switch (policy) {
        case EvictionPolicy::Lru:
            return {cls + last_used, 0, index};
        case EvictionPolicy::Lfu:
            return {cls + uses, last_used, index};
        case EvictionPolicy::Fifo:
            return {cls + stored_at, 0, index};
    }
    return {cls, 0, index};
}

}  // namespace peregrine
