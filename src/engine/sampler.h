// Choosing a sequence's next token from its logits row on the CPU, applying the request's
// sampling parameters in vLLM's order: logit bias, min_tokens masking, the structured-output
// mask, repetition /
// presence / frequency penalties, temperature, top-k, top-p, min-p. Logprobs are of the raw
// model distribution (before any processing), as vLLM reports by default.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/sampling_row.h"
#include "engine/sequence.h"

namespace peregrine {

// The draw of seq's next token from row `logits_row` of a step's logits, as the samplers take
// it: the request's parameters, seq's seed, RNG and token history (the row points into seq).
SampleRow sample_row(Sequence& seq, int logits_row, bool logprobs);

class Sampler {
  public:
    // `eos_ids`: the model's end tokens (masked while the row's mask_end is set).
    explicit Sampler(std::vector<int32_t> eos_ids) : eos_ids_(std::move(eos_ids)) {}

    // logits: [vocab] raw (the row's logits_row is the caller's to apply). Takes one value from
    // *row.rng when the row is not greedy, none when it is. Fills `logprob` when given (the
    // top row.num_logprobs alternatives, at most kMaxLogprobs).
    int32_t sample(const float* logits, int vocab, const SampleRow& row, TokenLogprob* logprob);

  private:
    std::vector<int32_t> eos_ids_;
    std::vector<float> work_;  // [vocab] processed logits
    std::vector<std::pair<float, int32_t>> cand_;
    std::vector<int32_t> counts_;  // [vocab] output-token counts, zeroed after use
    std::vector<uint8_t> seen_;    // [vocab] prompt or output token present
};

}  // namespace peregrine
