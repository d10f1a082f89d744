// The engine's step loop, single-threaded: requests in, one `step()` = schedule → run →
// sample → outputs. The threaded Engine (engine.h) drives it; tests drive it directly.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/batch_builder.h"
#include "engine/block_manager.h"
#include "engine/disk_block_file.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "grammar/token_cache.h"
#include "peregrine/engine_config.h"
#include "peregrine/engine_types.h"
#include "worker/executor.h"

namespace peregrine {

// The core's own settings (Engine::create derives them from the public EngineConfig).
struct CoreConfig {
    SchedulerConfig scheduler;
    EvictionPolicy eviction = EvictionPolicy::Lru;
    bool prefix_caching = true;
    std::vector<int32_t> eos_token_ids;
    // With device sampling, queue step N+1 before step N's tokens come back (its sequences take
    // N's draws as input tokens on the device), so the host's work overlaps the device's.
    bool async_scheduling = true;
    // Prefix-cache events of each step (EngineConfig::kv_events); empty: none recorded.
    std::function<void(std::vector<KvCacheEvent>)> kv_events;
    int64_t seed = -1;  // EngineConfig::seed: the default seed of requests without one; -1 random
    // Token ids of the prefixes to prefill at construction and keep for good (pin_prefix).
    std::vector<std::vector<int32_t>> pinned_prefixes;
    // The disk tier below the host tier (EngineConfig::kv_offload_disk, kv_offload_disk_size):
    // a directory for its file and its bytes; empty: none. Needs the executor's host tier.
    std::string disk_dir;
    int64_t disk_bytes = 0;
};

class EngineCore {
  public:
    // Outputs carry token ids only: text and stop strings are the front end's
    // (output_processor.h), off the engine thread.
    EngineCore(const CoreConfig& config, ModelExecutor& executor);
    ~EngineCore();

    // Throws Error (with a message fit for an API client) when the request is malformed:
    // empty or out-of-vocabulary prompt, a prompt that leaves no room in the context or the
    // KV cache, bad sampling values. Reads only immutable state: safe from any thread.
    // `has_text`: the front end matches stop strings (output_processor.h); without text they
    // are refused.
    void check_request(const Request& request, bool has_text = true) const;
    // Checks (as above, plus a duplicate id) and queues.
    // `grammar`: the compiled structured output of request.sampling.structured (null: none).
    // `arrived`: when the request reached the engine (EngineLoop::submit), the start of its queue
    // time and TTFT in the timings; default now.
    void add_request(Request request, std::shared_ptr<const grammar::TokenizedGrammar> grammar = nullptr,
                     std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now());
    // Ends every unfinished choice of the request now (finish reason "abort"), freeing its
    // blocks; the outputs come with the next `step()`. Unknown ids are ignored.
    void abort_request(const std::string& id);

    // Ends choice `index` of the request now (finish reason "stop"), as when a stop string was
    // matched in its text; the output comes with the next `step()`. Unknown or ended choices
    // are ignored.
    void stop_choice(const std::string& id, int index);

    // One iteration: the outputs of one model step (and any pending abort outputs). Under
    // async scheduling the next step is already queued when it returns.
    std::vector<RequestOutput> step();

    // The system-prompt cache: prefills `tokens` (a one-token request, run to its end; call
    // before any other request) and holds its leading full blocks (never the last token, which a
    // request sharing the prefix must compute itself) from then on: never evicted, a device hit
    // for every prompt that starts with them. Returns the tokens pinned. Throws when prefix
    // caching is off, requests are running, or the pins would take over half the KV cache.
    int pin_prefix(const std::vector<int32_t>& tokens);
    bool has_unfinished() const { return !requests_.empty() || inflight_.has_value(); }
    EngineStats stats() const;

    const BlockManager& block_manager() const { return blocks_; }
    DiskBlockFile* disk_file() const { return disk_.get(); }  // null without a disk tier
    const Scheduler& scheduler() const { return scheduler_; }
    // Live sequences (pinned prefixes' holders included), for invariant checks in tests.
    std::vector<const Sequence*> live_sequences() const;

  private:
    struct RequestState;
    // A queued model step and who draws from its logits.
    struct Launch {
        SchedulerOutput sched;
        // One per draw, read by the sampler at launch_sampling (device) or in collect (host, with
        // the sequences unchanged since); afterwards only logits_row and num_logprobs are valid.
        std::vector<SampleRow> rows;
        struct Draw {
            std::string request_id;
            int index = 0;      // choice index in the request
            int token_at = -1;  // >= 0: the slot in the sequence's tokens holding this draw's placeholder
        };
        std::vector<Draw> draws;  // one per row
        bool on_device = false;
        // Embedding sequences of the step, in batch order, and their pooled sums from the model:
        // pooled [pools.size(), hidden].
        struct Pool {
            std::string request_id;
            int begin = 0;  // the chunk's first position
        };
        std::vector<Pool> pools;
        std::vector<float> pooled;
        // Rows of sequences owing prompt logprobs (their logits come after the sampled rows; such
        // a step samples on the host and is never overlapped).
        std::vector<PromptLogprobRows> prompt_rows;
    };
    std::optional<Launch> launch(bool overlapped);
    bool can_overlap(const Launch& l) const;
    void collect(Launch& l, std::vector<RequestOutput>& outputs, std::vector<const Sequence*>& ended);
    void start_sampling(Launch& l, const std::vector<const Sequence*>& ended);
    void collect_pooled(Launch& l, std::vector<RequestOutput>& outputs);
    void finish_choice(RequestState& r, Sequence& seq, FinishReason reason, std::string stop, RequestOutput& out);
    void finish_request(RequestState& r, RequestOutput& last);
    void fork_choices(RequestState& r, Sequence& parent);
    // The disk tier: hands the I/O thread's answers to the block manager (a warning line per
    // dropped block), and issues a schedule's spills and reads.
    void finish_disk_io();
    void issue_disk_io(const BlockTransfers& t);

    CoreConfig config_;
    ModelExecutor& executor_;
    std::unique_ptr<DiskBlockFile> disk_;  // before blocks_, which is sized by it
    BlockManager blocks_;
    Scheduler scheduler_;
    Sampler sampler_;
    std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
    std::vector<RequestOutput> pending_;  // abort outputs not yet returned
    uint64_t next_seq_id_ = 1;
    uint64_t next_arrival_ = 1;
    uint64_t unseeded_requests_ = 0;  // requests given the default seed (CoreConfig::seed) so far
    BatchInput batch_;
    std::vector<float> logits_;
    std::vector<int32_t> sampled_;
    std::vector<TokenLogprob> sampled_lps_;
    std::vector<std::pair<float, int32_t>> prompt_lp_scratch_;  // [vocab] ranking of one prompt row
    std::optional<Launch> inflight_;                            // the queued step whose draws are not collected
    // Holders of the pinned prefixes' blocks (one reference each; never scheduled).
    std::vector<std::unique_ptr<Sequence>> pinned_;
    int pinned_blocks_ = 0;      // set before any request, read by check_request from any thread
    int kv_room_tokens() const;  // tokens the unpinned KV cache holds
    EngineStats totals_;
};

}  // namespace peregrine
