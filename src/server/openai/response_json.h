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
// `lps` whose text starts at character `offset` of the choice's text (advanced past them; a
// character is a Unicode code point, as Python's len counts). `top`: alternatives per token.
// `prompt_ids` (echo) come first as the echoed text has them: special tokens left out (BOS: the
// echoed text is the prompt as given, so tokens[0] is never "<s>"), SentencePiece's leading
// space dropped, so the tokens join into the text and text_offset points into it. Their
// logprobs are `prompt_lps` (RequestOutput::prompt_logprobs; token i's at i - 1): the first
// prompt token, which has none, and any not computed are null.
Json completion_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                              const std::vector<TokenLogprob>& prompt_lps, const std::vector<TokenLogprob>& lps,
                              int top, int* offset);
// vLLM's prompt_logprobs: one entry per prompt token, null for the first (and any not computed),
// else {"<token id>": {"logprob", "rank", "decoded_token"}} holding the prompt's token (its rank
// in the distribution) and the `top` most likely (ranks 1..top), each id once, the prompt's first.
Json prompt_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                          const std::vector<TokenLogprob>& prompt_lps, int top);
// Chat logprobs content entries [{token, logprob, bytes, top_logprobs: [...]}] for `lps`.
Json chat_logprobs_content(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top_logprobs);

// A choice's stop_reason: null (none), the stop string, or the stop token id as a number.
Json stop_reason_json(const std::string& s, const SamplingParams& sp);

// A random id suffix of 24 lowercase hex digits ("cmpl-<id>", "chatcmpl-<id>", "grpc-<id>").
std::string random_hex_id();

}  // namespace peregrine::server
