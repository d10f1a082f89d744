// The Exchange a /v1/responses request is answered through: it wraps the client's exchange and
// rewrites what the chat-completions job writes into it (completion_job.h) as the Responses API
// says it: a chat.completion as a response object; the chat.completion.chunk stream as the
// typed events (response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta, ..., response.completed), each with
// its sequence_number and without [DONE]. Errors keep OpenAI's error body; one in a stream
// becomes an `error` event. Everything else passes through to the wrapped exchange.
#pragma once

#include <memory>
#include <string>

#include "server/http/exchange.h"
#include "server/openai/json.h"

namespace peregrine::server {

// `echoed`: the request's fields a response object repeats (ResponsesRequest::echoed); `model`
// the served name answered with.
std::shared_ptr<Exchange> make_responses_exchange(std::shared_ptr<Exchange> inner, std::string id, std::string model,
                                                  Json echoed);

}  // namespace peregrine::server
