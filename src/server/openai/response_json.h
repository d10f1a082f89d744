// Pieces of the OpenAI response JSON shared by the whole and the streamed answers: usage,
// logprobs in both formats (legacy completions and chat), stop_reason, and the random part of
// response ids. Pure functions of their inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peregrine/engine_types.h"
#include "server/openai/json.h"

namespace peregrine {
class Tokenizer;
}

namespace peregrine::server {

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}
Json usage_json(const Usage& u);

// Legacy /v1/completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} for
// `lps` whose text starts at byte `offset` of the choice's text (advanced past them).
// `prompt_ids` (echo) come first with null logprobs (the engine computes none for prompt
// tokens), as the echoed text has them: special tokens left out, SentencePiece's leading space
// dropped, so the tokens join into the text and text_offset points into it.
Json completion_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                              const std::vector<TokenLogprob>& lps, int* offset);
// Chat logprobs content entries [{token, logprob, bytes, top_logprobs: [...]}] for `lps`.
Json chat_logprobs_content(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top_logprobs);

// A choice's stop_reason: null (none), the stop string, or the stop token id as a number.
Json stop_reason_json(const std::string& s, const SamplingParams& sp);

// A random id suffix of 24 lowercase hex digits ("cmpl-<id>", "chatcmpl-<id>", "grpc-<id>").
std::string random_hex_id();

}  // namespace peregrine::server
