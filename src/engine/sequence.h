// One sequence being generated: its tokens, its KV blocks, and its place in the schedule.
// Owned by the engine thread; nothing else touches it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "grammar/matcher.h"

#include "peregrine/engine_types.h"

namespace peregrine {

enum class SeqStatus { Waiting, Running, Finished };

struct Sequence {
    uint64_t seq_id = 0;
    std::string request_id;
    int index = 0;  // choice index within the request
    int priority = 0;
    uint64_t arrival = 0;  // submit order; ties in priority go to the earlier
    uint64_t group = 0;    // the client call it belongs to (fair sharing of running slots)
    // The first choice of an n > 1 request whose n - 1 siblings are forked from it once its
    // prompt is computed: it holds a running slot for each of them from admission on.
    bool fork_pending = false;
    SeqStatus status = SeqStatus::Waiting;
    const SamplingParams* sampling = nullptr;  // owned by the request
    uint64_t cache_salt = 0;                   // hash of the request's cache_salt (0 = none)
    bool keyed = false;  // the request names a conversation (prompt_cache_key): its blocks are kept longer

    std::vector<int32_t> tokens;  // prompt followed by the output
    int num_prompt_tokens = 0;
    int num_computed = 0;              // tokens whose K/V are in the cache (or swapped out to the host tier)
    int num_cached_prompt_tokens = 0;  // prompt tokens that came from the prefix cache (first admission)
    bool admitted_once = false;
    // Its prompt was looked up in the disk tier (once: its disk hits are read into the host
    // tier then; a later admission takes what reached it and recomputes the rest).
    bool disk_looked_up = false;
    std::vector<int32_t> block_table;  // logical block i -> physical block
    // Prompt logprobs (SamplingParams::prompt_logprobs): those of prompt positions
    // [1, prompt_logprobs_next) are computed (position 0 has none). Kept across a preemption, so
    // a recomputed prompt does not report its rows twice.
    int prompt_logprobs_next = 1;

    // An embedding request's (owned by the request; null: a generating sequence): its prompt is
    // prefilled, never sampled after (engine/pooling.h). `pooled` [hidden]: the sum of the rows
    // pooled so far.
    const PoolingParams* pooling = nullptr;
    std::vector<double> pooled;

    // Structured output: the grammar's state after the output so far, and the mask of the next
    // draw ([vocab words], bit t of word t/32 = token t allowed), refilled before each draw.
    std::optional<grammar::GrammarMatcher> grammar;
    std::vector<uint32_t> allowed;

    std::mt19937_64 rng;
    uint64_t seed = 0;   // what `rng` was seeded with (device samplers key their own generator by it)
    int max_tokens = 0;  // after clamping to the context

    int num_tokens() const { return static_cast<int>(tokens.size()); }
    int num_output() const { return num_tokens() - num_prompt_tokens; }
    int num_uncomputed() const { return num_tokens() - num_computed; }
    // Running slots (of max_num_seqs) this sequence takes while it runs.
    int seats() const { return fork_pending ? sampling->n : 1; }
    // Whether a step that computes tokens up to `end` samples a token after them: at the end of
    // the tokens, unless the sequence only pools.
    bool samples_at(int end) const { return end == num_tokens() && pooling == nullptr; }
    // Whether prompt rows still owe their logits for prompt logprobs.
    bool owes_prompt_logprobs() const {
        return pooling == nullptr && sampling != nullptr && sampling->prompt_logprobs >= 0 &&
               prompt_logprobs_next < num_prompt_tokens;
    }
    // Whether admission may skip prompt blocks found in the prefix cache: not for mean or cls
    // pooling, which need the hidden state of every (the first) prompt row, not just its K/V,
    // nor while prompt logprobs are owed, which need the logits of every prompt row (vLLM too
    // computes such prompts whole).
    bool reuses_prefix() const {
        return (pooling == nullptr || pooling->type == PoolingType::Last) && !owes_prompt_logprobs();
    }
};

}  // namespace peregrine
