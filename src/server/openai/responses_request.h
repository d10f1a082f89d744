// POST /v1/responses (OpenAI's Responses API) read as the chat-completions request it asks for:
// `input` items become chat messages (function_call items an assistant's tool_calls,
// function_call_output items tool messages), `instructions` a leading system message,
// max_output_tokens, text.format, tools and tool_choice their chat spellings. The chat body then
// takes the one request path (parse_completion_params, admit); responses_exchange.h writes its
// answer back as a response object or the typed event stream. The server keeps no responses.
#pragma once

#include <string>

#include "server/api_error.h"
#include "server/openai/json.h"

namespace peregrine::server {

struct ResponsesRequest {
    Json chat_body;  // a /v1/chat/completions body
    // The request fields a response object echoes (instructions, max_output_tokens, temperature,
    // top_p, tools, tool_choice, text, parallel_tool_calls, metadata, ...), in the Responses form.
    Json echoed;
    bool stream = false;
};

// Throws ApiError(400) naming the Responses field (e.g. "input[2].content") for bad input, and
// for what this server does not do (previous_response_id, item_reference, non-function tools).
ResponsesRequest parse_responses_request(const Json& body);

// An error from the chat path said with the Responses names of the fields it names
// (max_completion_tokens -> max_output_tokens, response_format -> text.format, messages -> input).
ApiError responses_error(const ApiError& e);

}  // namespace peregrine::server
