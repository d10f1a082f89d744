// What one draw of a token needs, as plain values: the row a sampler (the CPU one in
// src/engine/sampler.h, a device one behind device_sampler.h) takes instead of the engine's
// sequences, and the rules every sampler shares. Included by CUDA code: keep it plain C++.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace peregrine {

// Temperatures below this draw greedily (vLLM's epsilon): 1 / T would overflow the scaled
// logits long before the draw differed from the argmax.
constexpr float kGreedyTemperature = 1e-5f;

// The greedy rule of every sampler: the argmax (lowest id on ties) instead of a draw. NaN
// temperatures are greedy too.
constexpr bool is_greedy(float temperature, int top_k) {
    return !(temperature >= kGreedyTemperature) || top_k == 1;
}

// Whether the row's logits are penalised by the token history (repetition over prompt and
// output; presence and frequency over the output).
constexpr bool is_penalised(float repetition_penalty, float presence_penalty, float frequency_penalty) {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
}

// One draw from row `logits_row` of a step's logits [rows, vocab]. Processing in vLLM's order:
// logit bias, end-token masking, penalties, temperature, top-k, top-p, min-p. The spans point
// into the caller's token lists: valid until the sampler has read the row (a device sampler's
// launch, the CPU sampler's sample).
struct SampleRow {
    int32_t logits_row = 0;
    float temperature = 1.0f;  // is_greedy() decides
    float top_p = 1.0f;        // 1: off
    int32_t top_k = 0;         // 0: off
    float min_p = 0.0f;        // 0: off; drop tokens below min_p * p(most likely)
    float repetition_penalty = 1.0f;
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    // The draw's randomness. Device samplers key a counter-based generator (Philox) by `seed`
    // at counter `offset` (the tokens this sequence drew before); host samplers take one value
    // from `*rng` per non-greedy draw (null: greedy rows only).
    uint64_t seed = 0;
    uint64_t offset = 0;
    std::mt19937_64* rng = nullptr;
    // The token history the penalties read.
    std::span<const int32_t> prompt;
    std::span<const int32_t> output;
    int32_t num_logprobs = -1;  // -1: none; k >= 0: the chosen token's raw logprob and the top k
    // Host-only processing (device samplers are not given rows that need it): a bias added to
    // logits, and while `mask_end` the end tokens (the sampler's EOS ids and `stop_token_ids`)
    // are never chosen (min_tokens not reached).
    std::span<const std::pair<int32_t, float>> logit_bias;
    std::span<const int32_t> stop_token_ids;
    bool mask_end = false;
    // Structured output: only the tokens whose bit is set in `allowed` ([ceil(vocab / 32)]
    // words; ids past it are not allowed) may be chosen. `constrained` marks the row before the
    // mask is filled. Device samplers apply the mask too, except on a row that wants logprobs
    // (reported from the raw logits, which a device sampler masks in place).
    bool constrained = false;
    std::span<const uint32_t> allowed;

    constexpr bool greedy() const { return is_greedy(temperature, top_k); }
    constexpr bool penalised() const { return is_penalised(repetition_penalty, presence_penalty, frequency_penalty); }
    // Whether the draw needs the host-only fields (a device sampler cannot take it).
    constexpr bool needs_host() const { return !logit_bias.empty() || mask_end || (constrained && num_logprobs >= 0); }
    // Whether the draw reads more than the raw logits row.
    constexpr bool processes_logits() const { return needs_host() || penalised() || constrained; }
    // Whether the step after this draw's may be queued before the draw is back (async
    // scheduling): not when the host must see the token first to build the next draw's inputs
    // (host-only processing, penalty lists). A grammar's mask is built after the token is back
    // (EngineCore::start_sampling), so it does not stop the overlap.
    constexpr bool allows_overlap() const { return !needs_host() && !penalised(); }
};

}  // namespace peregrine
