// Paged KV-cache bookkeeping: a pool of fixed-size blocks, per-sequence block tables,
// reference counts, copy-on-write, and automatic prefix caching, with an optional host tier.
//
// Invariants (checked by tests after every step):
// - a block's reference count equals the number of live sequences whose table holds it;
// - a block with count 0 is either free (no hash) or evictable (hashed, still findable);
// - a hashed block holds exactly the tokens its hash was computed from, and the hash chains
//   over every earlier block of the sequence and the cache salt.
//
// Host tier (num_host_slots > 0): a findable block evicted from the device pool is offloaded
// (its K/V copied to a host slot, HostBlockPool) instead of forgotten; match_prefix continues a
// chain that misses on the device in the host tier, and allocate gives such host hits fresh
// device blocks whose K/V are onloaded (copied back). The copies of one schedule are collected
// here and taken once (take_transfers); the step must issue them in this order, before its
// copy-on-write copies and its compute: all offloads (so a reused device block is read before
// anything writes it), then all onloads. Host slots read by this schedule's onloads are pinned
// until take_transfers, so no offload of the same batch overwrites them.
//
// Swap preemption (swap_out / swap_in): a preempted sequence's computed blocks, full and
// partial, are copied to reserved host slots (outside the cache) and its device blocks
// released; on resumption fresh device blocks are onloaded from those slots and the sequence
// goes on from the same num_computed. The copies ride in the same BlockTransfers. A swap-in's
// slots are released at take_transfers, after the onloads that read them were handed out.
//
// Disk tier (num_disk_slots > 0, below the host tier): a host-tier block evicted for another is
// spilled (its bytes written to a disk slot, DiskBlockFile) unless this batch's offload into
// that slot was superseded (then its bytes never arrived). match_prefix continues a chain in
// the disk tier after the host tier; such hits are not adopted: prefetch reserves host slots and
// queues reads into them, and the sequence waits until finish_disk_read makes each a held host
// slot (or, on a failed read, drops the block: the sequence recomputes it). Spills and reads of
// one schedule ride in its BlockTransfers: spills are staged (host bytes copied) before the
// offloads that may overwrite their host slots; reads fill reserved slots nobody else touches.
// Disk slots read in a schedule are pinned until take_transfers, and the I/O thread runs writes
// and reads in issue order, so a later write to a slot comes after the read of its old block.
//
// Conversations: a block committed or adopted by a sequence with `keyed` set (the request's
// prompt_cache_key) is evicted, in both tiers, only after every anonymous block.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/eviction_policy.h"
#include "engine/host_block_pool.h"
#include "engine/sequence.h"
#include "peregrine/engine_types.h"

namespace peregrine {

struct BlockStats {
    uint64_t prefix_queries = 0;    // prompt tokens looked up in the prefix cache (both tiers)
    uint64_t prefix_hits = 0;       // of those, tokens found (in either tier)
    uint64_t evictions = 0;         // cached device blocks reused for other data
    uint64_t host_queries = 0;      // prompt tokens looked up in the host tier (those the device missed)
    uint64_t host_hits = 0;         // of those, tokens found there
    uint64_t offloaded_blocks = 0;  // device -> host copies issued
    uint64_t onloaded_blocks = 0;   // host -> device copies issued (swap-ins included)
    uint64_t swap_outs = 0;         // preempted sequences whose blocks went to the host tier
    uint64_t swapped_out_blocks = 0;
    uint64_t swapped_in_blocks = 0;
    uint64_t disk_queries = 0;         // prompt tokens looked up in the disk tier (device and host missed)
    uint64_t disk_hits = 0;            // of those, tokens found there (read back into the host tier)
    uint64_t disk_writes = 0;          // host -> disk block writes issued
    uint64_t disk_reads = 0;           // disk -> host block reads issued
    uint64_t disk_write_failures = 0;  // writes that failed or were skipped (block dropped)
    uint64_t disk_read_failures = 0;   // reads that failed (block dropped, recomputed)
};

// One block of a prefix hit: in the device pool (`block`), or only in the host tier
// (`host_slot`; allocate gives it a device block and queues its onload), or only on disk
// (`disk_slot`), or on its way from disk to the host tier (`loading`). Disk and loading hits are
// never adopted: the scheduler prefetches or waits, and cuts the chain before them.
struct PrefixHit {
    int32_t block = -1;
    int32_t host_slot = -1;
    int32_t disk_slot = -1;
    bool loading = false;
    bool on_host() const { return host_slot >= 0; }
    bool adoptable() const { return block >= 0 || host_slot >= 0; }
};

// A block moving between the host tier and the disk tier.
struct DiskCopy {
    int32_t host_slot = -1;
    int32_t disk_slot = -1;
    uint64_t hash = 0;  // stamped in the disk slot's header and checked on the read
};

// The K/V copies between the tiers one schedule decided, to be issued before its step in this
// order (offloads, then onloads).
struct BlockTransfers {
    std::vector<std::pair<int32_t, int32_t>> offloads;  // (device block, host slot): device -> host
    std::vector<std::pair<int32_t, int32_t>> onloads;   // (host slot, device block): host -> device
    std::vector<DiskCopy> spills;                       // host -> disk: staged before the offloads
    std::vector<DiskCopy> reads;                        // disk -> reserved host slots
    bool device_empty() const { return offloads.empty() && onloads.empty(); }
    bool empty() const { return device_empty() && spills.empty() && reads.empty(); }
};

class BlockManager {
  public:
    // num_host_slots > 0: a host tier of that many blocks (needs prefix_caching); num_disk_slots
    // > 0: a disk tier of that many blocks below it (needs the host tier).
    BlockManager(int num_blocks, int block_size, EvictionPolicy policy = EvictionPolicy::Lru,
                 bool prefix_caching = true, int num_host_slots = 0, int num_disk_slots = 0);

    int num_blocks() const { return static_cast<int>(blocks_.size()); }
    int block_size() const { return block_size_; }
    // Blocks a new allocation can take: free ones plus evictable cached ones.
    int num_available() const { return static_cast<int>(free_.size() + evictable_.size()); }
    int num_used() const { return num_blocks() - num_available(); }
    const BlockStats& stats() const { return stats_; }
    // The host tier (null without one).
    const HostBlockPool* host() const { return host_ ? &*host_ : nullptr; }
    uint64_t host_evictions() const { return host_ ? host_->evictions() : 0; }
    // The disk tier's bookkeeping (null without one).
    const HostBlockPool* disk() const { return disk_ ? &*disk_ : nullptr; }
    // Prefix-cache events (a block becoming findable, a findable block evicted), kept from
    // set_recording(true) until taken.
    void set_recording(bool on) { recording_ = on; }
    std::vector<KvCacheEvent> take_events() { return std::exchange(events_, {}); }
    // A prompt's first lookup: `queried` tokens, `hit` of them found in either tier; of those,
    // `host_queried` looked up in the host tier and `host_hit` found there.
    void count_prefix_query(int queried, int hit, int host_queried = 0, int host_hit = 0) {
        stats_.prefix_queries += queried;
        stats_.prefix_hits += hit;
        stats_.host_queries += host_queried;
        stats_.host_hits += host_hit;
    }

    // Leading full blocks of `seq.tokens` (never including its last token, which must be
    // computed to get logits) found in the prefix cache, tokens verified: each block in the
    // device pool, else in the host tier; the chain ends at the first block in neither. Takes
    // no references.
    std::vector<PrefixHit> match_prefix(const Sequence& seq) const;

    // The disk tier. count_disk_query: a prompt's disk lookup (`queried` tokens, `hit` found).
    // prefetch: reads the chain's disk hits into reserved host slots, as many as the host tier
    // can take (its other hits pinned meanwhile); the number of reads queued.
    // finish_disk_*: the I/O thread's answer; a failed read or write drops the block from the
    // disk tier (a read's host slot is released), a good read makes its slot a held host block.
    void count_disk_query(int queried, int hit) {
        stats_.disk_queries += queried;
        stats_.disk_hits += hit;
    }
    int prefetch(const std::vector<PrefixHit>& hits);
    int num_loading() const { return static_cast<int>(loading_.size()); }
    void finish_disk_read(uint64_t hash, bool ok);
    void finish_disk_write(int32_t disk_slot, uint64_t hash, bool ok);

    // Whether `seq` can be given room for `num_new` more tokens; `hits` are the prefix blocks
    // it will adopt (only for a sequence that holds no blocks yet; a host hit needs a block).
    bool can_allocate(const Sequence& seq, int num_new, const std::vector<PrefixHit>& hits = {}) const;

    // Adopts `hits` (seq must hold no blocks: sets num_computed to the hit tokens; host hits get
    // fresh device blocks, hashed and findable at once, with their onloads queued), then grows
    // the table to hold num_computed + num_new tokens. Shared blocks about to be written are
    // replaced by private copies; the (src, dst) block pairs whose K/V must be copied before
    // the step are appended to `copies`. Call can_allocate first.
    void allocate(Sequence& seq, int num_new, const std::vector<PrefixHit>& hits,
                  std::vector<std::pair<int32_t, int32_t>>& copies);

    // Swap preemption. swap_out copies the sequence's computed blocks to reserved host slots and
    // releases its device blocks, keeping num_computed; false (nothing done) when there is no
    // host tier, nothing computed, or too few slots: the caller releases it for recomputation.
    bool swap_out(Sequence& seq);
    bool is_swapped(const Sequence& seq) const { return swapped_.count(seq.seq_id) > 0; }
    // Whether a swapped-out sequence can come back with room for `num_new` more tokens.
    bool can_swap_in(const Sequence& seq, int num_new) const;
    // Gives it fresh device blocks and queues their onloads; then allocate as a running one.
    void swap_in(Sequence& seq);

    // The tier copies decided since the last call (in issue order), unpinning the host slots
    // they read: call once per schedule, and issue them before anything later is scheduled.
    BlockTransfers take_transfers();

    // After a step wrote K/V up to `num_computed` tokens: registers blocks that became full.
    void commit(Sequence& seq, int num_computed);

    // The child shares every block of the parent (copy-on-write later).
    void fork(const Sequence& parent, Sequence& child);

    // Releases the sequence's blocks (hashed ones stay findable until evicted) and the host
    // slots of a swapped-out one.
    void release(Sequence& seq);

    // For tests.
    int ref_count(int32_t block) const { return blocks_[block].ref; }
    bool is_cached(int32_t block) const { return blocks_[block].cached; }
    bool is_hashed(int32_t block) const { return blocks_[block].hashed; }
    uint64_t block_hash(int32_t block) const { return blocks_[block].hash; }

    static uint64_t hash_block(uint64_t parent, uint64_t salt, const int32_t* tokens, int n);
    static uint64_t hash_salt(const std::string& salt);

  private:
    struct Block {
        int ref = 0;
        bool hashed = false;  // full, with `hash` and `tokens` set
        bool cached = false;  // findable through cached_ (the first block with this hash)
        bool keyed = false;   // a conversation's block: evicted after anonymous ones
        uint64_t hash = 0;
        std::optional<uint64_t> parent;  // the previous block's hash; none for a sequence's first
        std::vector<int32_t> tokens;
        uint64_t last_used = 0;  // LRU
        uint64_t uses = 0;       // LFU
        uint64_t cached_at = 0;  // FIFO
        EvictionKey evict_key;   // position in evictable_ while there
    };

    int32_t take_block();  // a fresh private block (ref 1), evicting if needed
    // Announces `tokens` (one block) as findable in `medium`.
    void record_stored(uint64_t hash, std::optional<uint64_t> parent, const std::vector<int32_t>& tokens,
                       KvCacheEvent::Medium medium);
    void record_removed(uint64_t hash, KvCacheEvent::Medium medium);
    // Copies the evicted (still hashed) device block `b` to the host tier, unless held there.
    void offload(int32_t b);
    void add_ref(int32_t b);
    void drop_ref(int32_t b);
    EvictionKey eviction_key(int32_t b) const;

    int block_size_;
    EvictionPolicy policy_;
    bool prefix_caching_;
    std::vector<Block> blocks_;
    std::vector<int32_t> free_;                     // count 0, unhashed (a stack)
    std::set<EvictionKey> evictable_;               // count 0, cached; first = next victim
    std::unordered_map<uint64_t, int32_t> cached_;  // hash -> block
    std::optional<HostBlockPool> host_;
    BlockTransfers pending_;  // since the last take_transfers
    // A swapped-out block: its host slot and what the device block knew of it.
    struct Swapped {
        int32_t slot = -1;
        bool hashed = false, keyed = false;
        uint64_t hash = 0, uses = 0;
        std::optional<uint64_t> parent;
        std::vector<int32_t> tokens;
    };
    std::unordered_map<uint64_t, std::vector<Swapped>> swapped_;  // by seq_id, in table order
    std::vector<int32_t> swapped_in_slots_;                       // released at take_transfers
    // The host slot's eviction was announced and its pending offload dropped (else it is
    // spilled to the disk tier, when there is one).
    void forget_host_victim(const HostBlockPool::Stored& st);
    void spill(const HostBlockPool::Stored& st);
    void drop_disk(int32_t disk_slot, uint64_t hash);  // if that slot still holds `hash`
    std::optional<HostBlockPool> disk_;
    // Blocks being read from disk into a reserved host slot, by hash: what the slot will hold.
    struct Loading {
        int32_t host_slot = -1, disk_slot = -1;
        std::optional<uint64_t> parent;
        std::vector<int32_t> tokens;
        uint64_t uses = 0;
        bool keyed = false;
    };
    std::unordered_map<uint64_t, Loading> loading_;
    uint64_t clock_ = 0;
    BlockStats stats_;
    bool recording_ = false;
    std::vector<KvCacheEvent> events_;
};

}  // namespace peregrine
