// Where the router sends a request: the replicas it knows, their load and health, and the three
// policies of `peregrine router --policy` (plain code, no I/O; the proxy holds one Router).
//
//   round-robin  the next healthy replica in turn.
//   least-load   the healthy replica with the fewest outstanding requests (ties: the lowest
//                index after the last pick, so equal loads rotate).
//   cache-aware  (default) the replica where the prompt's first token should come soonest,
//                counting what its cache holds: each healthy replica costs, in prompt characters
//                of prefill, the prefill queued there (prompts sent whose first token has not
//                come back) + kDecodeRowChars per request it is decoding + the part of this
//                prompt its PrefixIndex does not hold - (prefix_weight - 1) x the part it holds
//                of this conversation's own history (a cached turn also serves the turns after
//                it). The cheapest wins (ties: fewer outstanding). A prefix every replica
//                holds (a shared system prompt) costs every replica alike: a prompt that no
//                replica holds more of than the others (a new conversation) goes, among the
//                replicas within kChunkChars of the cheapest, to the one whose index holds the
//                fewest keys (the smallest cache footprint), as SGLang's router sends a low match
//                to its smallest tree. Counting queued prefill rather than requests keeps a burst
//                of arrivals (clients resending as their answers end together) off one replica,
//                where a request count would send them all to the replica that just finished.
//                When the load is imbalanced (max - min > balance_abs_threshold outstanding and
//                max > balance_rel_threshold x min: SGLang's rule), least-load instead.
// Session affinity, under every policy: a request carrying a session key (OpenAI's
// `prompt_cache_key`, else `user`) goes to the replica the ConsistentHashRing gives that key
// among the healthy ones, so a conversation's cache stays on one replica.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace peregrine::router {

enum class Policy { RoundRobin, LeastLoad, CacheAware };
Policy policy_from_name(const std::string& name);  // throws Error naming the choices
const char* policy_name(Policy p);

// Which replicas have seen which prompt prefixes: the prompt's text cut into chunks of
// kChunkChars characters, each chunk's key a hash chained over every earlier chunk (so a key
// stands for the whole prefix up to it). Each replica keeps at most its capacity in keys (the
// constructor's, or set_capacity's: the Router sizes it from the replica's KV pool), least
// recently used evicted first, and of one prompt its last chunks first (a prefix's root stays
// while its leaves go, as a replica's prefix cache evicts); the index only approximates the
// replicas.
class PrefixIndex {
  public:
    static constexpr size_t kChunkChars = 64;
    explicit PrefixIndex(size_t capacity_per_replica = 1 << 16) : default_capacity_(capacity_per_replica) {}

    // The chained keys of `text`'s whole chunks (a trailing partial chunk has none).
    static std::vector<uint64_t> keys_of(std::string_view text);
    // Leading keys of `keys` that `replica` holds.
    size_t match(int replica, const std::vector<uint64_t>& keys) const;
    // Whether `keys`, matched on `replica` for `matched` keys, leave there a prefix that the
    // replica's latest prompt through it continued differently: a prefix other conversations
    // share (a system prompt), not this conversation's own history.
    bool diverges(int replica, const std::vector<uint64_t>& keys, size_t matched) const;
    // Records that `replica` was sent a prompt with `keys` (refreshing their recency).
    void insert(int replica, const std::vector<uint64_t>& keys);
    void forget(int replica);  // a replica that left (its cache is gone)
    size_t size() const;       // keys held, all replicas
    size_t size(int replica) const;
    // At most `keys` keys for `replica` from now on (evicting at once); 0: the default again.
    void set_capacity(int replica, size_t keys);
    size_t capacity(int replica) const;

  private:
    struct Entry {
        std::list<uint64_t>::iterator at;
        uint64_t next = 0;  // the key that followed it in the latest prompt (0: none)
    };
    struct Replica {
        std::list<uint64_t> lru;  // most recent first
        std::unordered_map<uint64_t, Entry> where;
        size_t capacity = 0;  // 0: default_capacity_
    };
    static void evict(Replica& r, size_t capacity);
    size_t default_capacity_;
    std::map<int, Replica> replicas_;
};

// Consistent hashing of session keys over replica names: kVirtualNodes points per replica on a
// 64-bit ring; a key goes to the first point at or after its hash among the eligible replicas.
// Adding a replica to N moves about 1/(N+1) of the keys.
class ConsistentHashRing {
  public:
    static constexpr int kVirtualNodes = 160;
    void set_replicas(const std::vector<std::string>& names);
    // The index (into the names given) of the key's replica among those with eligible[i] true;
    // -1 when none is eligible.
    int pick(std::string_view key, const std::vector<bool>& eligible) const;

  private:
    std::map<uint64_t, int> ring_;
};

// What a replica's /metrics says of its prefix cache (vLLM's names, which `serve` also
// exports): `vllm:cache_config_info{block_size,num_gpu_blocks}` and the tokens its prefix cache
// was queried for, `vllm:prefix_cache_queries_total` (every prompt token). Negative: absent.
struct CacheFacts {
    double block_size = -1, num_blocks = -1, queried_tokens = -1;
    bool complete() const { return block_size > 0 && num_blocks > 0 && queried_tokens >= 0; }
};
CacheFacts parse_cache_facts(std::string_view metrics_text);

// What the router knows of one replica.
struct ReplicaState {
    std::string url;          // http://host:port
    int id = 0;               // stable across set_urls (the prefix index's key)
    bool healthy = true;      // false: ejected (a connection failed, or /health did not answer 200)
    int outstanding = 0;      // requests sent and not finished
    int prefilling = 0;       // of those, the ones whose first token has not come back
    double queued_chars = 0;  // their prompt characters not in its cache: the prefill queued there
    uint64_t requests = 0, errors = 0;
    uint64_t prompt_chars = 0;                  // characters of the prompts sent (what the prefix index keys on)
    double pool_tokens = 0;                     // its KV pool, from /metrics (0: not known)
    double chars_per_token = 0;                 // prompt characters sent / prompt tokens it counted (0: not yet)
    double chars_baseline = -1;                 // prompt_chars and its queried tokens at the first /metrics read
    double queried_baseline = -1;               //   (-1: none yet)
    size_t index_keys = 0, index_capacity = 0;  // its prefix index (snapshot only)
};

// A routing decision and why, for the metrics ("session", "prefix", "smallest_cache",
// "least_load", "imbalanced", "round_robin", "no_replica").
struct Decision {
    int replica = -1;  // index in the replica list at the time of the pick
    int id = -1;       // the replica's stable id (finish, set_healthy)
    std::string url;
    const char* reason = "no_replica";
    size_t matched_chunks = 0;
    double prefill_chars = 0;  // the prompt's characters not in the replica's cache (estimated)
    uint64_t ticket = 0;       // its queued prefill (0: none, an empty prompt): first_token / finish
};

// The cache-aware policy's weights and bounds (`peregrine router --prefix-weight ...`; the
// balance thresholds are named as in SGLang's router).
struct CacheAwareOptions {
    double prefix_weight = 2;            // a held character of the conversation's own history, in
                                         // characters of prefill (1: this request's saving alone)
    int balance_abs_threshold = 32;      // outstanding requests, max - min
    double balance_rel_threshold = 1.5;  // max / min
};

// Thread safe: the proxy's I/O threads pick, finish and eject concurrently.
class Router {
  public:
    Router(Policy policy, std::vector<std::string> urls, CacheAwareOptions cache_aware = {});
    Policy policy() const { return policy_; }

    // Picks a healthy replica for a prompt (`text`: what the prefix index keys on) with an
    // optional session key, skipping `exclude` (a replica that already failed this request), and
    // counts it outstanding. Records the prompt's prefix for the chosen replica.
    Decision pick(std::string_view text, std::string_view session_key, int exclude = -1);
    // The request's first token came back (its first streamed token, or the whole answer): its
    // prefill leaves the replica's queue. Once per decision; finish does it when it never came.
    void first_token(const Decision& d);
    void finish(const Decision& d, bool failed);  // a request ended (failed: it errored)
    void set_healthy(int id, bool healthy);
    // A replica's cache facts (its /metrics, read by the health checker): once it has counted
    // kMinTokensForRatio prompt tokens since the first read, its prefix index holds at most
    // pool tokens x (prompt characters sent / tokens counted) / kChunkChars keys, so the index
    // forgets about when the replica evicts. A counter that went back (a restarted replica)
    // empties its index and starts over.
    static constexpr double kMinTokensForRatio = 1024;
    void observe_cache(int id, const CacheFacts& facts);
    // Replaces the replica set (DNS discovery): known URLs keep their state, new ones start
    // healthy, gone ones leave (their prefix index entries too).
    void set_urls(const std::vector<std::string>& urls);

    std::vector<ReplicaState> snapshot() const;
    size_t prefix_index_size() const;
    std::map<std::string, uint64_t> decisions() const;  // by reason

    // A request being decoded costs a new prompt on its replica about this many characters of
    // prefill (its row in every step until that prompt's first token): small next to a prompt.
    static constexpr double kDecodeRowChars = 16;

  private:
    int least_loaded(int exclude) const;  // -1: none healthy
    void settle(uint64_t ticket);         // a queued prefill is done (mu_ held)
    // cache-aware's choice by cost (the class comment), into d (mu_ held; keys not empty).
    void pick_by_cost(std::string_view text, const std::vector<uint64_t>& keys, const std::vector<bool>& eligible,
                      Decision& d) const;
    ReplicaState* by_id(int id);
    Policy policy_;
    CacheAwareOptions cache_aware_;
    mutable std::mutex mu_;
    std::vector<ReplicaState> replicas_;
    PrefixIndex index_;
    ConsistentHashRing ring_;
    size_t next_ = 0;  // round-robin / least-load tie rotation
    int next_id_ = 0;
    std::map<std::string, uint64_t> decisions_;
    struct Queued {
        int id;
        double chars;
    };
    std::unordered_map<uint64_t, Queued> queued_;  // by ticket: prefills not yet done
    uint64_t next_ticket_ = 1;
};

}  // namespace peregrine::router
