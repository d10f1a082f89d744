// The typed request of /v1/completions and /v1/chat/completions, whatever the transport: REST
// and WebSocket fill it from the JSON body (parse_completion_params), gRPC from its proto
// (grpc/proto_convert.h); then CompletionService::admit turns it into engine Requests. Both
// fillers end with check_sampling, so a CompletionParams from either has valid SamplingParams.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peregrine/engine_types.h"
#include "server/openai/json.h"

namespace peregrine::server {

enum class Endpoint { Completions, ChatCompletions };

// One prompt of /v1/completions: text (tokenized by the server) or token ids.
struct PromptInput {
    bool is_text = true;
    std::string text;
    std::vector<int32_t> ids;
};

// `field` of the body as prompts: a string, a list of strings, a list of token ids or a list of
// such lists (completions' `prompt`, embeddings' `input`). 400 naming the field otherwise.
std::vector<PromptInput> parse_prompts(const Json& body, const char* field);

struct CompletionParams {
    Endpoint endpoint = Endpoint::Completions;
    std::string model;                            // empty when the client left it out
    std::vector<PromptInput> prompts;             // completions
    Json messages;                                // chat: a list of {role, content (string)}
    SamplingParams sampling;                      // logprobs: -1 or k (top alternatives)
    bool max_tokens_given = false;                // otherwise: 16 for completions, the context left for chat
    std::string max_tokens_param = "max_tokens";  // the field it came from (chat: max_completion_tokens)
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
    bool echo = false;           // completions: the prompt text before the completion
    // vLLM's prompt_logprobs as the client asked (-1: not asked). sampling.prompt_logprobs is
    // what the engine computes: the larger of it and, with echo, `logprobs` (the echoed tokens').
    int prompt_logprobs = -1;
    bool chat_logprobs = false;           // chat: logprobs requested (top_logprobs in sampling.logprobs)
    int priority = 0;                     // lower runs first; clamped to +-1e6
    std::string cache_salt;               // isolates this client's prefix-cache entries
    std::string prompt_cache_key;         // the conversation: its cached blocks are kept longer
    std::string user;                     // the client's end-user id (accepted, not used)
    bool add_special_tokens = true;       // completions: true; chat: false (the template adds them)
    bool add_generation_prompt = true;    // chat
    bool continue_final_message = false;  // chat
    Json chat_template_kwargs = Json::object();
    std::string chat_template;  // chat: a Jinja template for this request instead of the model's; "" none
    // chat `tools` (rendered through the template) and, with tool_choice "required" or a named
    // function, the answer is forced into calls (sampling.structured holds their grammar) and
    // returned as message.tool_calls with finish_reason "tool_calls".
    Json tools;  // null: none
    bool forced_tool_calls = false;
    // tool_choice "auto": calls in the model's own format (the served model's --tool-call-parser)
    // are parsed out of the answer; a call to a name not in `tool_names` stays text.
    bool parse_tool_calls = false;
    std::vector<std::string> tool_names;
    bool parallel_tool_calls = true;  // false: the first call only (the rest of the answer is text)

    bool chat() const { return endpoint == Endpoint::ChatCompletions; }
};

// Parses a completions or chat request body (already a JSON object): JSON types here, then
// check_sampling(limits). Sampling fields the body leaves out keep their value in `defaults`
// (the model's generation_config.json). A field the server does not honour (unknown, or known
// and not supported) is refused. Throws ApiError(400) naming the field.
CompletionParams parse_completion_params(const Json& body, Endpoint endpoint, const SamplingLimits& limits = {},
                                         const SamplingParams& defaults = {});

// `tools`, `tool_choice` and `parallel_tool_calls` of a chat body (after its structured output,
// which forced calls exclude) into `params`. Throws ApiError(400) naming the field.
void parse_tools(const Json& body, CompletionParams& params);

// The sampling parameters through validate(); the first error as ApiError(400) naming the field
// as this request spelled it (max_completion_tokens; top_logprobs for chat). An echo request may
// ask for max_tokens 0 (the prompt only); min_tokens may pass the default max_tokens it never gave.
void check_sampling(const CompletionParams& params, const SamplingLimits& limits);

// One structured output as vLLM's structured_outputs writes it: `key` json (a schema object or its
// JSON text), regex, choice (a list of strings), grammar (GBNF) or json_object (true; false: none).
// Throws ApiError(400) naming `field`.
StructuredOutput structured_output_of(const std::string& key, const Json& value, const std::string& field);

// Chat messages as a template wants them: `content` a string (text parts joined), other
// fields kept. Throws ApiError(400) for anything else.
Json normalize_messages(const Json& messages);

}  // namespace peregrine::server
