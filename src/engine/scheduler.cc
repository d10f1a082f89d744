#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace peregrine {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks) : config_(config), blocks_(blocks) {
    PG_CHECK(config.max_num_seqs > 0 && config.max_num_batched_tokens > 0);
}

void Scheduler::add_waiting(Sequence* seq) {
    seq->status = SeqStatus::Waiting;
    Queue& q = waiting_[seq->group];
    if (!q.empty() && ByPriority()(seq, *q.begin())) heads_.erase(*q.begin());
    q.insert(seq);
    if (*q.begin() == seq) heads_.insert(seq);
    ++num_waiting_;
    waiting_seats_ += seq->seats();
}

void Scheduler::erase_waiting(Sequence* seq) {
    auto it = waiting_.find(seq->group);
    if (it == waiting_.end() || it->second.erase(seq) == 0) return;
    --num_waiting_;
    waiting_seats_ -= seq->seats();
    if (heads_.erase(seq) > 0 && !it->second.empty()) heads_.insert(*it->second.begin());
    if (it->second.empty()) waiting_.erase(it);
}

Sequence* Scheduler::next_waiting(const std::unordered_map<uint64_t, int>& seats_of) const {
    if (heads_.empty()) return nullptr;
    Sequence* best = *heads_.begin();
    std::unordered_map<uint64_t, int>::size_type groups = waiting_.size();
    for (const auto& [g, n] : seats_of) groups += waiting_.count(g) ? 0 : 1;
    const int fair = std::max<int>(1, config_.max_num_seqs / static_cast<int>(groups));
    for (Sequence* head : heads_) {
        if (head->priority != best->priority) break;
        const auto it = seats_of.find(head->group);
        if (it == seats_of.end() || it->second < fair) return head;
    }
    return best;  // every group of this priority holds its share: take the first anyway
}

void Scheduler::add_running(Sequence* seq) {
    seq->status = SeqStatus::Running;
    running_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
    erase_waiting(seq);
    running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
    blocks_.release(*seq);
}

void Scheduler::preempt(Sequence* seq, SchedulerOutput& out) {
    running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
    if (!config_.swap_preemption || !blocks_.swap_out(*seq)) blocks_.release(*seq);
    add_waiting(seq);
    out.preempted.push_back(seq);
    ++num_preemptions_;
}

SchedulerOutput Scheduler::schedule() {
    SchedulerOutput out;
    int budget = config_.max_num_batched_tokens;
    int logprob_rows = config_.max_prompt_logprob_rows;
    // A chunk of a sequence owing prompt logprobs takes at most the rows left (at least one, so
    // every such sequence still moves).
    auto cap_rows = [&](const Sequence& seq, int num_new) {
        if (!seq.owes_prompt_logprobs()) return num_new;
        num_new = std::min(num_new, std::max(1, logprob_rows));
        logprob_rows -= num_new;
        return num_new;
    };
    std::sort(running_.begin(), running_.end(), ByPriority());

    // Running sequences: decodes (one uncomputed token) first, then unfinished chunked prefills.
    // Victims come from the back of the priority order, so a victim is never one already
    // scheduled in this step.
    const std::vector<Sequence*> order = running_;
    for (const bool decodes : {true, false}) {
        for (Sequence* seq : order) {
            const int left = seq->num_uncomputed();
            if (budget == 0 || seq->status != SeqStatus::Running || (left == 1) != decodes || left == 0) continue;
            const int num_new = cap_rows(*seq, std::min(left, budget));
            while (seq->status == SeqStatus::Running && !blocks_.can_allocate(*seq, num_new)) {
                Sequence* victim = nullptr;
                for (auto it = running_.rbegin(); it != running_.rend() && !victim; ++it) {
                    const bool taken = std::any_of(out.seqs.begin(), out.seqs.end(),
                                                   [&](const ScheduledSeq& s) { return s.seq == *it; });
                    if (!taken) victim = *it;
                }
                PG_CHECK(victim, "no sequence to preempt");
                preempt(victim, out);
            }
            if (seq->status != SeqStatus::Running) continue;  // it was the victim
            blocks_.allocate(*seq, num_new, {}, out.block_copies);
            out.seqs.push_back({seq, num_new, seq->samples_at(seq->num_computed + num_new)});
            budget -= num_new;
        }
    }

    // Waiting sequences, unless this step had to preempt (they would only thrash).
    std::unordered_map<uint64_t, int> seats_of;  // running seats by group
    int seats = 0;
    for (const Sequence* seq : running_) {
        seats_of[seq->group] += seq->seats();
        seats += seq->seats();
    }
    while (out.preempted.empty() && num_waiting_ > 0 && budget > 0) {
        Sequence* seq = next_waiting(seats_of);
        if (seats + seq->seats() > config_.max_num_seqs) break;  // no room for it (or its siblings)
        // A swap-preempted sequence resumes where it stopped, its blocks copied back.
        const bool swapped = blocks_.is_swapped(*seq);
        std::vector<PrefixHit> hits;
        if (!swapped && seq->reuses_prefix()) hits = blocks_.match_prefix(*seq);
        if (!swapped && blocks_.disk() && !take_disk_hits(*seq, hits)) break;  // head of line waits for disk reads
        const int hit_tokens = static_cast<int>(hits.size()) * blocks_.block_size();
        const int want = std::min(seq->num_tokens() - (swapped ? seq->num_computed : hit_tokens), budget);
        const int rows_before = logprob_rows;
        const int num_new = cap_rows(*seq, want);
        if (swapped ? !blocks_.can_swap_in(*seq, num_new) : !blocks_.can_allocate(*seq, num_new, hits)) {
            logprob_rows = rows_before;
            break;  // head of line waits for memory
        }
        erase_waiting(seq);
        seats += seq->seats();
        seats_of[seq->group] += seq->seats();
        if (swapped) blocks_.swap_in(*seq);
        blocks_.allocate(*seq, num_new, hits, out.block_copies);
        if (!seq->admitted_once) {
            seq->admitted_once = true;
            seq->num_cached_prompt_tokens = std::min(hit_tokens, seq->num_prompt_tokens);
            // The host tier is asked about the blocks after the last device hit (the whole rest
            // of the prompt, as prefix_queries counts it); host hits count as cached tokens.
            int host_queried = 0, host_hit = 0;
            if (blocks_.host()) {
                int device_hits = 0;
                while (device_hits < static_cast<int>(hits.size()) && !hits[device_hits].on_host()) ++device_hits;
                host_queried = seq->num_prompt_tokens - device_hits * blocks_.block_size();
                for (const PrefixHit& h : hits) host_hit += h.on_host() ? blocks_.block_size() : 0;
            }
            blocks_.count_prefix_query(seq->num_prompt_tokens, seq->num_cached_prompt_tokens, host_queried, host_hit);
        }
        add_running(seq);
        out.seqs.push_back({seq, num_new, seq->samples_at(seq->num_computed + num_new)});
        budget -= num_new;
    }
    for (const ScheduledSeq& s : out.seqs) out.num_tokens += s.num_new;
    out.transfers = blocks_.take_transfers();
    return out;
}

bool Scheduler::take_disk_hits(Sequence& seq, std::vector<PrefixHit>& hits) {
    const auto first_far = std::find_if(hits.begin(), hits.end(), [](const PrefixHit& h) { return !h.adoptable(); });
    if (!seq.disk_looked_up) {
        seq.disk_looked_up = true;
        const int near = static_cast<int>(first_far - hits.begin());
        const int far = static_cast<int>(hits.size()) - near;
        blocks_.count_disk_query(seq.num_prompt_tokens - near * blocks_.block_size(), far * blocks_.block_size());
        if (far > 0 && blocks_.prefetch(hits) > 0) return false;
    }
    // Reads in flight end (well or not) within a few steps; blocks still on disk after this
    // sequence's one prefetch are recomputed (the host tier had no room for them).
    if (std::any_of(first_far, hits.end(), [](const PrefixHit& h) { return h.loading; })) return false;
    hits.erase(first_far, hits.end());
    return true;
}

void Scheduler::commit(const SchedulerOutput& out) {
    for (const ScheduledSeq& s : out.seqs) blocks_.commit(*s.seq, s.seq->num_computed + s.num_new);
}

}  // namespace peregrine
