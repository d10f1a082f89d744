// Prompt logprobs (SamplingParams::prompt_logprobs): the logits row of prompt position q gives
// the logprob of prompt token q + 1. A step that computes prompt positions of a sequence owing
// them asks the model for those rows' logits too (after the sampled rows, so the samplers' row
// numbers are unchanged), and keeps only each row's logprob, rank and top k: never more than
// one step's rows [rows, vocab] f32 are held (a step has at most max_num_batched_tokens rows).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/sequence.h"

namespace peregrine {

// The prompt positions [first, last) of chunk [begin, end) whose rows give prompt logprobs
// still owed: the rows before the prompt's last position (whose row is the first draw's), from
// the first one not reported yet. Empty (first == last) when none.
std::pair<int, int> prompt_logprob_positions(const Sequence& seq, int begin, int end);

// One sequence's prompt-logprob rows of a step: positions [first_pos, first_pos + count) are
// logits rows [first_row, first_row + count) of the step's logits.
struct PromptLogprobRows {
    Sequence* seq = nullptr;
    int first_pos = 0;
    int count = 0;
    int first_row = 0;
};

// logits: [rows, vocab] of the step. Appends, for each row of `span`, the logprob of the prompt
// token after its position and the top `top` alternatives to `out`, and advances the
// sequence's prompt_logprobs_next past them.
void take_prompt_logprobs(const float* logits, int vocab, int top, const PromptLogprobRows& span,
                          std::vector<TokenLogprob>& out, std::vector<std::pair<float, int32_t>>& scratch);

}  // namespace peregrine
