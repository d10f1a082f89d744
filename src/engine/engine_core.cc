#include "engine/engine_core.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "engine/pooling.h"

namespace peregrine {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::Stop:
            return "stop";
        case FinishReason::Length:
            return "length";
        case FinishReason::Abort:
            return "abort";
        case FinishReason::None:
            break;
    }
    return "";
}

using Clock = std::chrono::steady_clock;

struct EngineCore::RequestState {
    Request req;
    Clock::time_point arrived, scheduled, first_token;
    bool was_scheduled = false, has_token = false;
    std::vector<std::unique_ptr<Sequence>> seqs;  // choice i at index i once forked
    std::vector<bool> finished;
    int num_finished = 0;
    bool forked = false;
    uint64_t base_seed = 0;
    // SamplingParams::prompt_logprobs gathered over the prompt's steps, handed out with choice
    // 0's first output (RequestOutput::prompt_logprobs).
    std::vector<TokenLogprob> prompt_logprobs;
};

namespace {

// Distinct, reproducible RNG seeds for the n choices of one request.
uint64_t choice_seed(uint64_t base, int index) {
    uint64_t z = base + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(index + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The prompt's checks here; the sampling parameters' in peregrine::validate (sampling_params.cc),
// which the server also calls before it submits. Throws the first problem found.
void check_prompt(const Request& r, int vocab, int max_model_len, int kv_tokens) {
    if (r.prompt_ids.empty()) fail("the prompt is empty");
    for (int32_t t : r.prompt_ids)
        if (t < 0 || t >= vocab) fail("prompt token id ", t, " is outside the vocabulary (0..", vocab - 1, ")");
    if (r.pooling) {  // an embedding's input may fill the context: nothing is generated after it
        if (r.sampling.n != 1) fail("'n' must be 1 for an embedding request, got ", r.sampling.n);
        if (static_cast<int>(r.prompt_ids.size()) > max_model_len)
            fail("the prompt has ", r.prompt_ids.size(), " tokens, more than the model's context of ", max_model_len,
                 " tokens");
        if (static_cast<int>(r.prompt_ids.size()) > kv_tokens)
            fail("the prompt has ", r.prompt_ids.size(), " tokens; the KV cache holds only ", kv_tokens);
        return;
    }
    if (static_cast<int>(r.prompt_ids.size()) >= max_model_len)
        fail("the prompt has ", r.prompt_ids.size(), " tokens, which leaves no room in the model's context of ",
             max_model_len, " tokens");
    if (static_cast<int>(r.prompt_ids.size()) >= kv_tokens)
        fail("the prompt has ", r.prompt_ids.size(), " tokens; the KV cache holds only ", kv_tokens);
}

std::unique_ptr<DiskBlockFile> make_disk_tier(const CoreConfig& config, ModelExecutor& executor) {
    if (config.disk_dir.empty()) return nullptr;
    if (!config.prefix_caching || executor.num_host_kv_blocks() == 0 || !executor.host_kv_data())
        fail("--kv-offload-disk needs a host tier to read its blocks back through (--kv-offload-memory)");
    return std::make_unique<DiskBlockFile>(config.disk_dir, config.disk_bytes, executor.kv_block_bytes());
}

}  // namespace

EngineCore::EngineCore(const CoreConfig& config, ModelExecutor& executor)
    : config_(config),
      executor_(executor),
      disk_(make_disk_tier(config, executor)),
      blocks_(executor.num_kv_blocks(), executor.block_size(), config.eviction, config.prefix_caching,
              config.prefix_caching ? executor.num_host_kv_blocks() : 0, disk_ ? disk_->num_slots() : 0),
      scheduler_(config.scheduler, blocks_),
      sampler_(config.eos_token_ids) {
    blocks_.set_recording(static_cast<bool>(config.kv_events));
    totals_.kv_cache_dtype = executor.kv_cache_dtype();  // fixed for the pool's life
    for (const std::vector<int32_t>& prefix : config.pinned_prefixes) {
        const int pinned = pin_prefix(prefix);
        std::fprintf(stderr, "  pinned prefix %zu: %d of its %zu tokens held in the KV cache for good\n",
                     pinned_.size(), pinned, prefix.size());
    }
}

int EngineCore::kv_room_tokens() const {
    return (executor_.num_kv_blocks() - pinned_blocks_) * executor_.block_size();
}

int EngineCore::pin_prefix(const std::vector<int32_t>& tokens) {
    if (!config_.prefix_caching) fail("a pinned prefix needs prefix caching");
    if (has_unfinished()) fail("prefixes are pinned before any request runs");
    const int bs = executor_.block_size();
    const int blocks = tokens.empty() ? 0 : (static_cast<int>(tokens.size()) - 1) / bs;
    // The rest of the pool must still hold requests (and a pin never starves the cache).
    if (2 * (pinned_blocks_ + blocks) > executor_.num_kv_blocks())
        fail("pinned prefixes would hold ", pinned_blocks_ + blocks, " of the KV cache's ", executor_.num_kv_blocks(),
             " blocks of ", bs, " tokens; at most half may be pinned");
    Request r;
    r.id = "pin-prefix-" + std::to_string(pinned_.size());
    r.prompt_ids = tokens;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 1;
    r.sampling.ignore_eos = true;
    add_request(r);  // checks the tokens
    while (has_unfinished()) step();
    auto holder = std::make_unique<Sequence>();
    holder->seq_id = next_seq_id_++;
    holder->request_id = r.id;
    holder->status = SeqStatus::Running;
    holder->tokens = tokens;
    holder->num_prompt_tokens = static_cast<int>(tokens.size());
    // The prefix's blocks were just computed; only those still in the device pool are taken
    // (a pool so small that they were evicted already pins less).
    std::vector<PrefixHit> hits = blocks_.match_prefix(*holder);
    const auto host = std::find_if(hits.begin(), hits.end(), [](const PrefixHit& h) { return h.block < 0; });
    hits.erase(host, hits.end());
    std::vector<std::pair<int32_t, int32_t>> copies;
    blocks_.allocate(*holder, 0, hits, copies);
    PG_CHECK(copies.empty() && blocks_.take_transfers().empty(), "pinning copied blocks");
    pinned_blocks_ += static_cast<int>(hits.size());
    totals_.pinned_prefix_tokens += static_cast<uint64_t>(hits.size()) * bs;
    pinned_.push_back(std::move(holder));
    return static_cast<int>(hits.size()) * bs;
}

EngineCore::~EngineCore() = default;

void EngineCore::check_request(const Request& request, bool has_text) const {
    check_prompt(request, executor_.vocab_size(), executor_.max_model_len(), kv_room_tokens());
    SamplingLimits limits;
    limits.vocab_size = executor_.vocab_size();
    limits.max_num_seqs = config_.scheduler.max_num_seqs;
    limits.has_tokenizer = has_text;
    const std::vector<FieldError> errors = validate(request.sampling, limits);
    if (!errors.empty()) fail(errors.front().message);
}

void EngineCore::add_request(Request request, std::shared_ptr<const grammar::TokenizedGrammar> grammar,
                             Clock::time_point arrived) {
    check_request(request);
    PG_CHECK(!grammar == (request.sampling.structured.kind == StructuredOutput::Kind::None),
             "a structured-output request needs its compiled grammar");
    if (requests_.count(request.id)) fail("a request with id '", request.id, "' is already running");
    auto r = std::make_unique<RequestState>();
    r->req = std::move(request);
    r->arrived = arrived;
    const SamplingParams& p = r->req.sampling;
    if (p.seed)
        r->base_seed = *p.seed;
    else if (config_.seed >= 0)  // the run's k-th unseeded request: the same in every run
        r->base_seed = choice_seed(static_cast<uint64_t>(config_.seed), static_cast<int>(unseeded_requests_++));
    else
        r->base_seed = std::random_device{}() * 0x100000001ull + std::random_device{}();
    r->finished.assign(p.n, false);
    auto seq = std::make_unique<Sequence>();
    seq->seq_id = next_seq_id_++;
    seq->request_id = r->req.id;
    seq->priority = r->req.priority;
    seq->arrival = next_arrival_++;
    seq->group = std::hash<std::string>()(r->req.group.empty() ? r->req.id : r->req.group);
    seq->fork_pending = p.n > 1;
    seq->sampling = &r->req.sampling;
    seq->cache_salt = BlockManager::hash_salt(r->req.cache_salt);
    seq->keyed = !r->req.prompt_cache_key.empty();
    if (seq->keyed) ++totals_.conversation_requests;
    seq->tokens = r->req.prompt_ids;
    seq->num_prompt_tokens = static_cast<int>(seq->tokens.size());
    // A sequence must fit the model's context and, alone, the whole KV cache.
    const int room = std::min(executor_.max_model_len(), kv_room_tokens());
    seq->max_tokens = r->req.pooling ? 0 : std::min(p.max_tokens, room - seq->num_prompt_tokens);
    if (r->req.pooling) seq->pooling = &*r->req.pooling;
    seq->seed = choice_seed(r->base_seed, 0);
    seq->rng.seed(seq->seed);
    if (grammar) {
        seq->allowed.resize(grammar->vocab().vocab.mask_words());
        seq->grammar.emplace(std::move(grammar));
    }
    totals_.prompt_tokens += seq->num_prompt_tokens;
    scheduler_.add_waiting(seq.get());
    r->seqs.push_back(std::move(seq));
    requests_.emplace(r->req.id, std::move(r));
}

void EngineCore::abort_request(const std::string& id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    RequestState& r = *it->second;
    // Choices not forked yet end too: report every index of the request.
    for (int i = 0; i < r.req.sampling.n; ++i) {
        if (r.finished[i]) continue;
        RequestOutput out;
        out.request_id = id;
        out.index = i;
        if (i < static_cast<int>(r.seqs.size())) {
            finish_choice(r, *r.seqs[i], FinishReason::Abort, "", out);
        } else {
            out.finish = FinishReason::Abort;
            r.finished[i] = true;
            ++r.num_finished;
        }
        pending_.push_back(std::move(out));
    }
    finish_request(r, pending_.back());
}

void EngineCore::stop_choice(const std::string& id, int index) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    RequestState& r = *it->second;
    if (index < 0 || index >= static_cast<int>(r.seqs.size()) || r.finished[index]) return;
    RequestOutput out;
    out.request_id = id;
    out.index = index;
    finish_choice(r, *r.seqs[index], FinishReason::Stop, "", out);
    pending_.push_back(std::move(out));
    if (r.num_finished == r.req.sampling.n) finish_request(r, pending_.back());
}

void EngineCore::finish_request(RequestState& r, RequestOutput& last) {
    Usage usage;
    usage.prompt_tokens = r.seqs[0]->num_prompt_tokens;
    usage.cached_tokens = r.seqs[0]->num_cached_prompt_tokens;
    for (const auto& s : r.seqs) {
        usage.completion_tokens += s->num_output();
        usage.max_choice_tokens = std::max(usage.max_choice_tokens, s->num_output());
    }
    last.usage = usage;
    const Clock::time_point now = Clock::now();
    auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    RequestTiming t;
    t.total = secs(now - r.arrived);
    if (r.was_scheduled) t.queue = secs(r.scheduled - r.arrived);
    if (r.has_token) {
        t.prefill = secs(r.first_token - r.scheduled);
        t.decode = secs(now - r.first_token);
        t.time_to_first_token = secs(r.first_token - r.arrived);
    }
    last.timing = t;
    requests_.erase(r.req.id);  // destroys r
}

void EngineCore::finish_choice(RequestState& r, Sequence& seq, FinishReason reason, std::string stop,
                               RequestOutput& out) {
    out.finish = reason;
    out.stop_reason = std::move(stop);
    seq.status = SeqStatus::Finished;
    scheduler_.remove(&seq);
    r.finished[seq.index] = true;
    ++r.num_finished;
}

void EngineCore::fork_choices(RequestState& r, Sequence& parent) {
    r.forked = true;
    parent.fork_pending = false;  // its siblings take over the seats it held for them
    for (int i = 1; i < r.req.sampling.n; ++i) {
        auto child = std::make_unique<Sequence>(parent);  // tokens, counters, sampling pointer
        child->seq_id = next_seq_id_++;
        child->index = i;
        child->block_table.clear();
        child->seed = choice_seed(r.base_seed, i);
        child->rng.seed(child->seed);
        blocks_.fork(parent, *child);
        scheduler_.add_running(child.get());
        r.seqs.push_back(std::move(child));
    }
}

bool EngineCore::can_overlap(const Launch& l) const {
    if (!config_.async_scheduling || !l.on_device || l.rows.empty() ||
        static_cast<int>(l.rows.size()) > executor_.max_fed_draws())
        return false;
    // While requests wait, a step queued now would leave them out: they would join only the
    // step after it, a whole step later (H100, 1B, 256 clients: ~33 ms steps while a wave of
    // prompts is admitted). So the next step is scheduled once this one's tokens are back, with
    // the arrivals in it; decode-only stretches keep the overlap. PEREGRINE_OVERLAP_WAITING=1
    // queues ahead regardless (for comparisons).
    static const bool overlap_waiting = env_equals("PEREGRINE_OVERLAP_WAITING", "1");
    if (scheduler_.num_waiting() > 0 && !overlap_waiting) return false;
    // A step with embedding sequences reads its hidden states back right after it runs (launch),
    // before another step may overwrite them: such steps are never queued ahead. Nor those
    // computing prompt rows whose logits the host reads for prompt logprobs.
    for (const auto& [id, r] : requests_) {
        if (r->req.pooling) return false;
        for (const auto& s : r->seqs)
            if (s->status != SeqStatus::Finished &&
                (s->owes_prompt_logprobs() || !sample_row(*s, 0, r->req.sampling.logprobs >= 0).allows_overlap()))
                return false;
    }
    return true;
}

// Schedules and queues one model step. `overlapped`: the in-flight step's draws are not back
// yet; each of its sequences that may go on gets a placeholder token (-1 - draw index) that
// the device replaces with the draw, and that collect() replaces on the host.
std::optional<EngineCore::Launch> EngineCore::launch(bool overlapped) {
    const Clock::time_point t0 = Clock::now();
    if (overlapped) {
        for (size_t i = 0; i < inflight_->draws.size(); ++i) {
            Launch::Draw& d = inflight_->draws[i];
            const auto it = requests_.find(d.request_id);
            if (it == requests_.end() || it->second->finished[d.index]) continue;
            Sequence& seq = *it->second->seqs[d.index];
            if (seq.num_output() + 1 >= seq.max_tokens) continue;  // this draw ends it
            d.token_at = seq.num_tokens();
            seq.tokens.push_back(-1 - static_cast<int32_t>(i));
        }
    }
    Launch l;
    if (disk_) finish_disk_io();
    l.sched = scheduler_.schedule();
    if (disk_) issue_disk_io(l.sched.transfers);
    if (l.sched.empty()) {
        PG_CHECK(l.sched.transfers.device_empty(), "tier copies decided for an empty step");
        // Nothing runs until a disk read lands: wait for the I/O thread rather than spin.
        if (!overlapped && blocks_.num_loading() > 0) disk_->wait_done(std::chrono::milliseconds(5));
        return std::nullopt;
    }
    ++totals_.steps;
    for (const ScheduledSeq& s : l.sched.seqs) {
        RequestState& r = *requests_.at(s.seq->request_id);
        if (!r.was_scheduled) {
            r.was_scheduled = true;
            r.scheduled = t0;
        }
    }
    build_batch(l.sched, executor_.block_size(), batch_, &l.prompt_rows);
    // Sampling happens on the device when the executor can and no sequence needs what only
    // the CPU sampler does (logit_bias, min_tokens masking, logprobs of a constrained draw);
    // then only token ids come back. (An overlapped launch was allowed only when every live
    // sequence qualifies.)
    // Prompt logprobs read every requested row on the host.
    l.on_device = executor_.samples_on_device() && l.prompt_rows.empty();
    for (size_t i = 0; l.on_device && i < l.sched.seqs.size(); ++i) {
        const ScheduledSeq& s = l.sched.seqs[i];
        l.on_device = !s.sample ||
                      !sample_row(*s.seq, 0, requests_.at(s.seq->request_id)->req.sampling.logprobs >= 0).needs_host();
    }
    PG_CHECK(l.on_device || !overlapped, "an overlapped step must sample on the device");
    const Clock::time_point t1 = Clock::now();
    // Offloads first (they read blocks this step reuses), then onloads, then copy-on-write.
    if (!l.sched.transfers.offloads.empty()) executor_.offload_blocks(l.sched.transfers.offloads);
    if (!l.sched.transfers.onloads.empty()) executor_.onload_blocks(l.sched.transfers.onloads);
    executor_.copy_blocks(l.sched.block_copies);
    if (l.on_device)
        executor_.execute_on_device(batch_);
    else
        executor_.execute(batch_, logits_);
    for (const PromptLogprobRows& rows : l.prompt_rows) {
        RequestState& r = *requests_.at(rows.seq->request_id);
        take_prompt_logprobs(logits_.data(), executor_.vocab_size(), r.req.sampling.prompt_logprobs, rows,
                             r.prompt_logprobs, prompt_lp_scratch_);
    }
    if (!batch_.pool_ranges.empty()) {
        executor_.pool(batch_, l.pooled);
        for (const ScheduledSeq& s : l.sched.seqs)
            if (s.seq->pooling) l.pools.push_back({s.seq->request_id, s.seq->num_computed});
    }
    const Clock::time_point t2 = Clock::now();
    totals_.schedule_seconds += std::chrono::duration<double>(t1 - t0).count();
    totals_.execute_seconds += std::chrono::duration<double>(t2 - t1).count();

    if (!overlapped) start_sampling(l, {});
    return l;
}

// Commits the step's tokens to the cache bookkeeping and queues its draws, leaving out the
// sequences that ended since it was scheduled (their results are dropped).
void EngineCore::start_sampling(Launch& l, const std::vector<const Sequence*>& ended) {
    auto gone = [&](const Sequence* s) { return std::find(ended.begin(), ended.end(), s) != ended.end(); };
    // A sampling sequence's logits row is its rank among the batch's sampling sequences.
    std::vector<std::pair<int, Sequence*>> sampling;  // (row, sequence), live ones
    int row = 0;
    for (const ScheduledSeq& s : l.sched.seqs) {
        if (!s.sample) continue;
        if (!gone(s.seq)) sampling.emplace_back(row, s.seq);
        ++row;
    }
    if (!ended.empty()) std::erase_if(l.sched.seqs, [&](const ScheduledSeq& s) { return gone(s.seq); });
    scheduler_.commit(l.sched);
    // Who draws: each sampling sequence, and right after a prompt with n > 1 the other n-1
    // choices too (forked now, from the committed prompt), each drawing its own first token
    // from that row.
    for (const auto& [r_row, seq] : sampling) {
        RequestState& r = *requests_.at(seq->request_id);
        const bool want_lp = r.req.sampling.logprobs >= 0;
        // (Forked choices below copy the state and the mask: they draw from the same point.)
        // The budget (max_tokens) bounds the grammar too: near its end the mask keeps only the
        // tokens after which the structure still closes, EOS included, within it.
        if (seq->grammar) seq->grammar->fill_next_token_bitmask(seq->allowed, seq->max_tokens - seq->num_output());
        l.rows.push_back(sample_row(*seq, r_row, want_lp));
        l.draws.push_back({r.req.id, seq->index, -1});
        if (!r.forked && r.req.sampling.n > 1 && seq->index == 0 && seq->num_output() == 0) {
            fork_choices(r, *seq);
            for (size_t i = 1; i < r.seqs.size(); ++i) {
                l.rows.push_back(sample_row(*r.seqs[i], r_row, want_lp));
                l.draws.push_back({r.req.id, static_cast<int>(i), -1});
            }
        }
    }
    if (l.on_device && !l.rows.empty()) executor_.launch_sampling(l.rows);
}

// Takes the step's draws: tokens into their sequences (over placeholders where a later step
// was queued), stop checks, outputs. Draws of sequences that ended meanwhile are dropped;
// sequences ending now are added to `ended` (their memory may be gone after this).
void EngineCore::collect(Launch& l, std::vector<RequestOutput>& outputs, std::vector<const Sequence*>& ended) {
    const Clock::time_point t0 = Clock::now();
    std::vector<int32_t>& tokens = sampled_;
    std::vector<TokenLogprob>& lps = sampled_lps_;
    if (l.rows.empty()) {
        tokens.clear();
    } else if (l.on_device) {
        executor_.collect_samples(tokens, lps);
        for (TokenLogprob& lp : lps) lp.rank = 0;  // not computed there (the buffers are reused)
    } else {  // sampled here, right after the step (never overlapped): the rows' sequences are as built
        const int vocab = executor_.vocab_size();
        tokens.resize(l.rows.size());
        lps.resize(l.rows.size());
        for (size_t i = 0; i < l.rows.size(); ++i) {
            const SampleRow& row = l.rows[i];
            const float* logits = logits_.data() + static_cast<size_t>(row.logits_row) * vocab;
            tokens[i] = sampler_.sample(logits, vocab, row, row.num_logprobs >= 0 ? &lps[i] : nullptr);
        }
    }
    PG_CHECK(tokens.size() == l.rows.size());
    collect_pooled(l, outputs);

    // The draws of one request are consecutive (a sequence, or a prompt's n choices).
    for (size_t g = 0; g < l.draws.size();) {
        size_t end = g + 1;
        while (end < l.draws.size() && l.draws[end].request_id == l.draws[g].request_id) ++end;
        const auto it = requests_.find(l.draws[g].request_id);
        if (it == requests_.end()) {  // aborted while the step ran
            g = end;
            continue;
        }
        RequestState& r = *it->second;
        bool any = false;
        for (size_t i = g; i < end; ++i) {
            const Launch::Draw& d = l.draws[i];
            if (r.finished[d.index]) continue;
            Sequence* seq = r.seqs[d.index].get();
            any = true;
            RequestOutput out;
            out.request_id = r.req.id;
            out.index = seq->index;
            const int32_t tok = tokens[i];
            if (d.token_at >= 0)
                seq->tokens[d.token_at] = tok;
            else
                seq->tokens.push_back(tok);
            ++totals_.generation_tokens;
            out.token_ids.push_back(tok);
            if (l.rows[i].num_logprobs >= 0) out.logprobs.push_back(std::move(lps[i]));
            // Complete by now: the prompt's last rows ran in the step of its first draw.
            if (d.index == 0 && !r.prompt_logprobs.empty()) out.prompt_logprobs.swap(r.prompt_logprobs);

            const SamplingParams& p = r.req.sampling;
            const bool is_eos = std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), tok) !=
                                config_.eos_token_ids.end();
            const bool is_stop_token =
                std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
            // Structured output: the draw was masked, so the grammar takes it (a refusal would be
            // a bug: the choice is aborted, saying so, rather than continued off the grammar);
            // the EOS it allows once the text is complete ends the choice even under ignore_eos.
            const bool refused = seq->grammar && !seq->grammar->accept_token(tok);
            const bool grammar_done = seq->grammar && !refused && seq->grammar->is_terminated();
            if (refused)
                finish_choice(r, *seq, FinishReason::Abort,
                              "structured output: the grammar refused token " + std::to_string(tok), out);
            else if ((is_eos && !p.ignore_eos) || is_stop_token || grammar_done)
                finish_choice(r, *seq, FinishReason::Stop, is_stop_token ? std::to_string(tok) : "", out);
            else if (seq->num_output() >= seq->max_tokens)
                finish_choice(r, *seq, FinishReason::Length, "", out);
            if (seq->status == SeqStatus::Finished) ended.push_back(seq);
            outputs.push_back(std::move(out));
        }
        g = end;
        if (!any) continue;
        if (!r.has_token) {
            r.has_token = true;
            r.first_token = Clock::now();
        }
        if (r.num_finished == r.req.sampling.n) finish_request(r, outputs.back());
    }
    totals_.postprocess_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

// Adds each embedding sequence's pooled rows of the step to its sum; a sequence whose prompt is
// now computed ends with its embedding (one output, finish reason "stop").
void EngineCore::collect_pooled(Launch& l, std::vector<RequestOutput>& outputs) {
    if (l.pools.empty()) return;
    const size_t hidden = l.pooled.size() / l.pools.size();
    PG_CHECK(hidden * l.pools.size() == l.pooled.size() && hidden > 0, "pooled rows do not match the step");
    for (size_t i = 0; i < l.pools.size(); ++i) {
        const auto it = requests_.find(l.pools[i].request_id);
        if (it == requests_.end()) continue;  // aborted
        RequestState& r = *it->second;
        Sequence& seq = *r.seqs[0];
        if (r.finished[0]) continue;
        if (l.pools[i].begin == 0 || seq.pooled.size() != hidden) seq.pooled.assign(hidden, 0.0);
        const float* row = l.pooled.data() + i * hidden;
        for (size_t c = 0; c < hidden; ++c) seq.pooled[c] += row[c];
        if (seq.num_computed < seq.num_tokens()) continue;  // more chunks to come
        r.has_token = true;                                 // the embedding stands for the first token in the timings
        r.first_token = Clock::now();
        RequestOutput out;
        out.request_id = r.req.id;
        out.embedding = finish_embedding(seq.pooled, seq.num_prompt_tokens, *seq.pooling);
        finish_choice(r, seq, FinishReason::Stop, "", out);
        outputs.push_back(std::move(out));
        finish_request(r, outputs.back());
    }
}

std::vector<RequestOutput> EngineCore::step() {
    std::vector<RequestOutput> outputs = std::move(pending_);
    pending_.clear();
    if (!inflight_) {
        inflight_ = launch(false);
        if (!inflight_) return outputs;
    }
    // Queue the next step before waiting for this one when its inputs can come from the
    // device: the host's scheduling and enqueueing then overlap the device's work.
    std::optional<Launch> next;
    if (can_overlap(*inflight_)) next = launch(true);
    std::vector<const Sequence*> ended;
    collect(*inflight_, outputs, ended);
    inflight_.reset();
    if (next) {
        start_sampling(*next, ended);
        inflight_ = std::move(next);
    }
    if (config_.kv_events) {
        std::vector<KvCacheEvent> events = blocks_.take_events();
        if (!events.empty()) config_.kv_events(std::move(events));
    }
    return outputs;
}

void EngineCore::finish_disk_io() {
    for (const DiskBlockFile::Done& d : disk_->take_done()) {
        if (!d.ok && !d.error.empty())
            std::fprintf(stderr,
                         "warning: KV disk tier: %s of block %016llx in %s failed (%s); block dropped, its "
                         "tokens will be recomputed\n",
                         d.is_read ? "read" : "write", static_cast<unsigned long long>(d.hash), disk_->path().c_str(),
                         d.error.c_str());
        if (d.is_read)
            blocks_.finish_disk_read(d.hash, d.ok);
        else
            blocks_.finish_disk_write(d.slot, d.hash, d.ok);
    }
}

// Spills first: their host slots may be overwritten by this step's offloads (issued after) or
// filled by its reads. Both only touch host slots no queued device copy still writes.
void EngineCore::issue_disk_io(const BlockTransfers& t) {
    if (t.spills.empty() && t.reads.empty()) return;
    executor_.wait_host_kv();
    char* host = static_cast<char*>(executor_.host_kv_data());
    const size_t bytes = executor_.kv_block_bytes();
    for (const DiskCopy& c : t.spills) disk_->write(c.disk_slot, c.hash, host + c.host_slot * bytes);
    for (const DiskCopy& c : t.reads) disk_->read(c.disk_slot, c.hash, host + c.host_slot * bytes);
}

EngineStats EngineCore::stats() const {
    EngineStats s = totals_;
    s.num_running = scheduler_.num_running();
    s.num_waiting = scheduler_.num_waiting_seats();
    s.num_kv_blocks = blocks_.num_blocks();
    s.num_kv_blocks_used = blocks_.num_used();
    s.block_size = blocks_.block_size();
    s.prefix_queries = blocks_.stats().prefix_queries;
    s.prefix_hits = blocks_.stats().prefix_hits;
    s.evictions = blocks_.stats().evictions;
    s.preemptions = scheduler_.num_preemptions();
    s.swap_preemptions = blocks_.stats().swap_outs;
    s.kv_swapped_out_blocks = blocks_.stats().swapped_out_blocks;
    s.kv_swapped_in_blocks = blocks_.stats().swapped_in_blocks;
    if (const HostBlockPool* host = blocks_.host()) {
        s.num_host_kv_blocks = host->num_slots();
        s.num_host_kv_blocks_used = host->num_used();
        s.host_evictions = host->evictions();
    }
    s.host_prefix_queries = blocks_.stats().host_queries;
    s.host_prefix_hits = blocks_.stats().host_hits;
    s.kv_offloaded_blocks = blocks_.stats().offloaded_blocks;
    s.kv_onloaded_blocks = blocks_.stats().onloaded_blocks;
    s.kv_block_bytes = executor_.kv_block_bytes();
    if (const HostBlockPool* disk = blocks_.disk()) {
        s.num_disk_kv_blocks = disk->num_slots();
        s.num_disk_kv_blocks_used = disk->num_used();
        s.disk_evictions = disk->evictions();
        s.disk_slot_bytes = DiskBlockFile::slot_stride(disk_->block_bytes());
        s.kv_disk_written_bytes = disk_->bytes_written();
        s.kv_disk_read_bytes = disk_->bytes_read();
    }
    s.disk_prefix_queries = blocks_.stats().disk_queries;
    s.disk_prefix_hits = blocks_.stats().disk_hits;
    s.kv_disk_written_blocks = blocks_.stats().disk_writes;
    s.kv_disk_read_blocks = blocks_.stats().disk_reads;
    s.disk_write_failures = blocks_.stats().disk_write_failures;
    s.disk_read_failures = blocks_.stats().disk_read_failures;
    return s;
}

std::vector<const Sequence*> EngineCore::live_sequences() const {
    std::vector<const Sequence*> out;
    for (const auto& s : pinned_) out.push_back(s.get());
    for (const auto& [id, r] : requests_)
        for (const auto& s : r->seqs)
            if (s->status != SeqStatus::Finished) out.push_back(s.get());
    return out;
}

}  // namespace peregrine
