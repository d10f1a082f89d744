#include "engine/prompt_logprobs.h"

#include <algorithm>

#include "core/error.h"
#include "engine/logprobs.h"

namespace peregrine {

std::pair<int, int> prompt_logprob_positions(const Sequence& seq, int begin, int end) {
    if (!seq.owes_prompt_logprobs()) return {0, 0};
    const int first = std::max(begin, seq.prompt_logprobs_next - 1);
    const int last = std::min(end, seq.num_prompt_tokens - 1);
    return first < last ? std::pair{first, last} : std::pair{0, 0};
}

void take_prompt_logprobs(const float* logits, int vocab, int top, const PromptLogprobRows& span,
                          std::vector<TokenLogprob>& out, std::vector<std::pair<float, int32_t>>& scratch) {
    Sequence& seq = *span.seq;
    // Rows are reported in order, each once: the span starts at the first one owed.
    PG_CHECK(span.first_pos + 1 == seq.prompt_logprobs_next, "prompt logprob rows out of order");
    for (int i = 0; i < span.count; ++i) {
        TokenLogprob lp;
        lp.token = seq.tokens[span.first_pos + i + 1];
        fill_logprobs(logits + static_cast<size_t>(span.first_row + i) * vocab, vocab, top, &lp, scratch);
        out.push_back(std::move(lp));
    }
    seq.prompt_logprobs_next += span.count;
}

}  // namespace peregrine
