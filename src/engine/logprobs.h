// Log-probabilities of one logits row, as reported to clients: the raw model distribution
// (log-softmax of the logits, before any sampling processing), shared by the sampler (the drawn
// token's logprob) and prompt logprobs (each prompt token's).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "peregrine/engine_types.h"

namespace peregrine {

// Larger logit first; ties to the smaller id, so results never depend on the sort's internals.
inline bool by_logit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// logits: [vocab] raw. Fills out->logprob and out->rank of out->token (set by the caller) and
// out->top with the `top` most likely tokens (most likely first; none for top <= 0).
// `scratch` is the caller's buffer for the ranking (grown to vocab when top > 0).
void fill_logprobs(const float* logits, int vocab, int top, TokenLogprob* out,
                   std::vector<std::pair<float, int32_t>>& scratch);

}  // namespace peregrine
