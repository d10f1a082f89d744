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

// LRU: last use; LFU: (uses, last use); FIFO: when it was stored.
inline EvictionKey eviction_key(EvictionPolicy policy, uint64_t last_used, uint64_t uses, uint64_t stored_at,
                                int32_t index) {
    switch (policy) {
        case EvictionPolicy::Lru:
            return {last_used, 0, index};
        case EvictionPolicy::Lfu:
            return {uses, last_used, index};
        case EvictionPolicy::Fifo:
            return {stored_at, 0, index};
    }
    return {0, 0, index};
}

}  // namespace peregrine
