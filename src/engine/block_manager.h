// Paged KV-cache bookkeeping: a pool of fixed-size blocks, per-sequence block tables,
// reference counts, copy-on-write, and automatic prefix caching.
//
// Invariants (checked by tests after every step):
// - a block's reference count equals the number of live sequences whose table holds it;
// - a block with count 0 is either free (no hash) or evictable (hashed, still findable);
// - a hashed block holds exactly the tokens its hash was computed from, and the hash chains
//   over every earlier block of the sequence and the cache salt.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/sequence.h"
#include "peregrine/engine_types.h"

namespace peregrine {

enum class EvictionPolicy { Lru, Lfu, Fifo };
EvictionPolicy eviction_policy_from_name(const std::string& name);  // "lru" | "lfu" | "fifo"

struct BlockStats {
    uint64_t prefix_queries = 0;  // prompt tokens looked up in the prefix cache
    uint64_t prefix_hits = 0;     // of those, tokens found
    uint64_t evictions = 0;       // cached blocks reused for other data
};

class BlockManager {
  public:
    BlockManager(int num_blocks, int block_size, EvictionPolicy policy = EvictionPolicy::Lru,
                 bool prefix_caching = true);

    int num_blocks() const { return static_cast<int>(blocks_.size()); }
    int block_size() const { return block_size_; }
    // Blocks a new allocation can take: free ones plus evictable cached ones.
    int num_available() const { return static_cast<int>(free_.size() + evictable_.size()); }
    int num_used() const { return num_blocks() - num_available(); }
    const BlockStats& stats() const { return stats_; }
    // Prefix-cache events (a block becoming findable, a findable block evicted), kept from
    // set_recording(true) until taken.
    void set_recording(bool on) { recording_ = on; }
    std::vector<KvCacheEvent> take_events() { return std::exchange(events_, {}); }
    void count_prefix_query(int queried_tokens, int hit_tokens) {
        stats_.prefix_queries += queried_tokens;
        stats_.prefix_hits += hit_tokens;
    }

    // Leading full blocks of `seq.tokens` (never including its last token, which must be
    // computed to get logits) found in the prefix cache, tokens verified. Takes no references.
    std::vector<int32_t> match_prefix(const Sequence& seq) const;

    // Whether `seq` can be given room for `num_new` more tokens; `hits` are the prefix blocks
    // it will adopt (only for a sequence that holds no blocks yet).
    bool can_allocate(const Sequence& seq, int num_new, const std::vector<int32_t>& hits = {}) const;

    // Adopts `hits` (seq must hold no blocks: sets num_computed to the hit tokens), then grows
    // the table to hold num_computed + num_new tokens. Shared blocks about to be written are
    // replaced by private copies; the (src, dst) block pairs whose K/V must be copied before
    // the step are appended to `copies`. Call can_allocate first.
    void allocate(Sequence& seq, int num_new, const std::vector<int32_t>& hits,
                  std::vector<std::pair<int32_t, int32_t>>& copies);

    // After a step wrote K/V up to `num_computed` tokens: registers blocks that became full.
    void commit(Sequence& seq, int num_computed);

    // The child shares every block of the parent (copy-on-write later).
    void fork(const Sequence& parent, Sequence& child);

    // Releases the sequence's blocks (hashed ones stay findable until evicted).
    void release(Sequence& seq);

    // For tests.
    int ref_count(int32_t block) const { return blocks_[block].ref; }
    bool is_cached(int32_t block) const { return blocks_[block].cached; }
    uint64_t block_hash(int32_t block) const { return blocks_[block].hash; }

    static uint64_t hash_block(uint64_t parent, uint64_t salt, const int32_t* tokens, int n);
    static uint64_t hash_salt(const std::string& salt);

  private:
    struct Block {
        int ref = 0;
        bool hashed = false;  // full, with `hash` and `tokens` set
        bool cached = false;  // findable through cached_ (the first block with this hash)
        uint64_t hash = 0;
        std::vector<int32_t> tokens;
        uint64_t last_used = 0;                             // LRU
        uint64_t uses = 0;                                  // LFU
        uint64_t cached_at = 0;                             // FIFO
        std::tuple<uint64_t, uint64_t, int32_t> evict_key;  // position in evictable_ while there
    };

    int32_t take_block();  // a fresh private block (ref 1), evicting if needed
    void record_stored(const Block& blk, std::optional<uint64_t> parent);
    void add_ref(int32_t b);
    void drop_ref(int32_t b);
    std::tuple<uint64_t, uint64_t, int32_t> eviction_key(int32_t b) const;

    int block_size_;
    EvictionPolicy policy_;
    bool prefix_caching_;
    std::vector<Block> blocks_;
    std::vector<int32_t> free_;                                    // count 0, unhashed (a stack)
    std::set<std::tuple<uint64_t, uint64_t, int32_t>> evictable_;  // count 0, cached; first = next victim
    std::unordered_map<uint64_t, int32_t> cached_;                 // hash -> block
    uint64_t clock_ = 0;
    BlockStats stats_;
    bool recording_ = false;
    std::vector<KvCacheEvent> events_;
};

}  // namespace peregrine
