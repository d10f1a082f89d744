// The OpenAI wire format: request JSON → what the engine needs (validated, every fault a 400
// naming the field), and the pieces of response JSON (usage, logprobs in both formats).
// Pure functions of their inputs, no I/O: the HTTP side calls them on its own threads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "peregrine/engine_types.h"

namespace peregrine {
class Tokenizer;
}

namespace peregrine::server {

using Json = nlohmann::ordered_json;

enum class Endpoint { Completions, ChatCompletions };

// One prompt of /v1/completions: text (tokenized by the server) or token ids.
struct PromptInput {
    bool is_text = true;
    std::string text;
    std::vector<int32_t> ids;
};

struct CompletionParams {
    Endpoint endpoint = Endpoint::Completions;
    std::string model;                            // empty when the client left it out
    std::vector<PromptInput> prompts;             // completions
    Json messages;                                // chat: a list of {role, content (string)}
    SamplingParams sampling;                      // logprobs: -1 or k (top alternatives)
    bool max_tokens_given = false;                // otherwise: 16 for completions, the context left for chat
    std::string max_tokens_param = "max_tokens";  // the field it came from (chat: max_completion_tokens)
    bool stream = false;
    bool include_usage = false;
    bool echo = false;           // completions: the prompt text before the completion
    bool chat_logprobs = false;  // chat: logprobs requested (top_logprobs in sampling.logprobs)
    int priority = 0;
    std::string cache_salt;
    bool add_special_tokens = true;       // completions: true; chat: false (the template adds them)
    bool add_generation_prompt = true;    // chat
    bool continue_final_message = false;  // chat
    Json chat_template_kwargs = Json::object();
};

// Parses and checks a completions or chat request body (already a JSON object). Unknown
// fields are ignored. Throws ApiError(400) naming the field.
CompletionParams parse_completion_params(const Json& body, Endpoint endpoint);

// Chat messages as a template wants them: `content` a string (text parts joined), other
// fields kept. Throws ApiError(400) for anything else.
Json normalize_messages(const Json& messages);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}
Json usage_json(const Usage& u);

// Legacy /v1/completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} for
// `lps` whose text starts at byte `offset` of the choice's text (advanced past them).
// `prompt_ids` (echo) come first with null logprobs.
Json completion_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                              const std::vector<TokenLogprob>& lps, int* offset);
// Chat logprobs content entries [{token, logprob, bytes, top_logprobs: [...]}] for `lps`.
Json chat_logprobs_content(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top_logprobs);

// A random id suffix of 24 lowercase hex digits.
std::string random_hex_id();

}  // namespace peregrine::server
