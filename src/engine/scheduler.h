// Iteration-level scheduling: each step fills a token budget and a sequence cap with running
// decodes first, then running chunked prefills, then waiting sequences in (priority, arrival)
// order. When KV blocks run out, the lowest-priority, latest-arriving running sequence is
// preempted: its blocks freed and its tokens recomputed later, or, with swap preemption, its
// blocks copied to the host tier and copied back when it resumes (recomputed after all when the
// tier has no room). With a host tier, admission's prefix
// lookup continues in host memory; the copies between the tiers come out with the schedule.
//
// Running slots are seats: a sequence takes one, an n > 1 request's first choice takes n until
// its siblings fork from it, so the running sequences never exceed max_num_seqs. Seats are
// shared fairly between groups (client calls): among waiting sequences of the best priority, a
// group holding its fair share (max_num_seqs / groups present, at least 1) yields to one that
// does not. A call with thousands of sequences therefore delays another call's sequence at most
// until one of its own running sequences ends, never behind its whole queue.
#pragma once

#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace peregrine {

struct SchedulerConfig {
    int max_num_seqs = 256;
    int max_num_batched_tokens = 2048;
    // Preempt by swapping blocks to the host tier (BlockManager::swap_out) instead of recomputing.
    bool swap_preemption = false;
    // Prompt rows a step may compute for sequences that owe prompt logprobs: each row's logits
    // ([vocab] f32) are held on the host until the step's rows are reduced, so this bounds that
    // (512 x 128k vocab: 256 MiB). Such a prompt then runs in chunks of at most this many tokens.
    int max_prompt_logprob_rows = 512;
};

struct ScheduledSeq {
    Sequence* seq;
    int num_new;  // tokens [seq->num_computed, seq->num_computed + num_new) run this step
    bool sample;  // the chunk reaches the end of the sequence: a token is sampled after it
};

struct SchedulerOutput {
    std::vector<ScheduledSeq> seqs;
    // Before the step, in this order: the tier copies (offloads, then onloads), then the
    // copy-on-write copies (src, dst).
    BlockTransfers transfers;
    std::vector<std::pair<int32_t, int32_t>> block_copies;
    std::vector<Sequence*> preempted;
    int num_tokens = 0;
    bool empty() const { return seqs.empty(); }
};

class Scheduler {
  public:
    Scheduler(const SchedulerConfig& config, BlockManager& blocks);

    void add_waiting(Sequence* seq);
    void add_running(Sequence* seq);  // a forked child that shares its parent's blocks
    // Takes the sequence out of every queue and frees its blocks.
    void remove(Sequence* seq);

    SchedulerOutput schedule();
    // After the step ran: the scheduled tokens are now in the cache.
    void commit(const SchedulerOutput& out);

    int num_waiting() const { return num_waiting_; }
    // Waiting sequences counting a not-yet-started n > 1 request as its n choices.
    int num_waiting_seats() const { return waiting_seats_; }
    int num_running() const { return static_cast<int>(running_.size()); }
    uint64_t num_preemptions() const { return num_preemptions_; }
    const std::vector<Sequence*>& running() const { return running_; }

  private:
    struct ByPriority {
        bool operator()(const Sequence* a, const Sequence* b) const {
            if (a->priority != b->priority) return a->priority < b->priority;
            if (a->arrival != b->arrival) return a->arrival < b->arrival;
            return a->seq_id < b->seq_id;
        }
    };
    using Queue = std::set<Sequence*, ByPriority>;
    void preempt(Sequence* seq, SchedulerOutput& out);
    // With a disk tier: on a prompt's first lookup, counts it and prefetches its disk hits;
    // false while any of its hits is being read (it waits), else cuts `hits` before the first
    // one it cannot adopt.
    bool take_disk_hits(Sequence& seq, std::vector<PrefixHit>& hits);
    void erase_waiting(Sequence* seq);
    // The waiting sequence to admit next (null when none): see the fairness rule above.
    // `seats_of` holds each group's running seats.
    Sequence* next_waiting(const std::unordered_map<uint64_t, int>& seats_of) const;

    SchedulerConfig config_;
    BlockManager& blocks_;
    std::unordered_map<uint64_t, Queue> waiting_;  // by group, each in priority order
    Queue heads_;                                  // the first of each group's queue
    int num_waiting_ = 0;
    int waiting_seats_ = 0;
    std::vector<Sequence*> running_;
    uint64_t num_preemptions_ = 0;
};

}  // namespace peregrine
