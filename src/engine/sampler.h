// Choosing each sequence's next token from its logits row, applying the request's
// sampling parameters in vLLM's order: logit bias, min_tokens masking, repetition /
// presence / frequency penalties, temperature, top-k, top-p, min-p. Logprobs are of the raw
// model distribution (before any processing), as vLLM reports by default.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "engine/sequence.h"

namespace peregrine {

constexpr int kMaxLogprobs = 20;

// Whether drawing seq's next token reads more than its raw logits: logit_bias, min_tokens
// masking, or penalties over its token history.
bool processes_logits(const Sequence& seq);

class Sampler {
  public:
    // `eos_ids`: the model's end tokens (masked while min_tokens is not reached).
    explicit Sampler(std::vector<int32_t> eos_ids) : eos_ids_(std::move(eos_ids)) {}

    // logits: [vocab] raw. Uses seq's RNG (one draw when sampling, none when greedy).
    // Fills `logprob` when the request asked for logprobs.
    int32_t sample(const float* logits, int vocab, Sequence& seq, TokenLogprob* logprob);

  private:
    void raw_logprobs(const float* logits, int vocab, int top, TokenLogprob* out);

    std::vector<int32_t> eos_ids_;
    std::vector<float> work_;  // [vocab] processed logits
    std::vector<std::pair<float, int32_t>> cand_;
    std::vector<int32_t> counts_;  // [vocab] output-token counts, zeroed after use
    std::vector<uint8_t> seen_;    // [vocab] prompt or output token present
};

}  // namespace peregrine
