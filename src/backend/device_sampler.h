// Sampling where the logits are (a GPU): only token ids and requested logprobs come back.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/sampling_row.h"

namespace peregrine {

struct Tensor;
struct TokenLogprob;

// Handles penalties, temperature, top-k/p, min-p and seeds; not logit_bias or end-token masking
// (SampleRow's host-only fields), for which the engine downloads the logits and samples on the
// CPU. One draw set at a time: launch, then collect, then the next launch.
class DeviceSampler {
  public:
    virtual ~DeviceSampler() = default;
    // Queues one draw per row. logits: [rows, vocab] f32 on the device. The rows (and the token
    // histories they point to) are read here only, not by collect.
    virtual void launch(const Tensor& logits, const std::vector<SampleRow>& rows) = 0;
    // Waits for the last launch's draws: one token per row, logprobs filled for rows that ask.
    virtual void collect(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) = 0;
    // Up to how many draws of the last launch the next step can take as input tokens on the
    // device (BatchInput token id -1 - i = draw i) without them coming back first; 0 = none.
    virtual int max_fed_draws() const { return 0; }
};

}  // namespace peregrine
