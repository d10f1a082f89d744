// The gRPC API's messages (proto/peregrine/v1/inference.proto) to and from the server's own
// types, with no JSON in between: a GenerateRequest becomes the same typed CompletionParams the
// REST API parses from JSON, an engine output a GenerateResponse, an ApiError a grpc::Status.
#pragma once

#include <grpcpp/support/status.h>

#include "peregrine/engine_types.h"
#include "peregrine/v1/inference.pb.h"
#include "server/api_error.h"
#include "server/openai/completion_request.h"
#include "server/openai/tool_call_stream.h"

namespace peregrine::server {

// Exactly one of prompt, prompt_ids or messages; the sampling fields as the HTTP API takes them
// (0 / absent: `defaults`, the model's generation_config.json), checked by check_sampling(limits). Throws
// ApiError(400).
CompletionParams completion_params_from_proto(const ::peregrine::v1::GenerateRequest& req, const SamplingLimits& limits,
                                              const SamplingParams& defaults = {});

// Chat messages as the chat template takes them: [{role, content}].
Json chat_messages_json(const google::protobuf::RepeatedPtrField<::peregrine::v1::ChatMessage>& messages);

::peregrine::v1::GenerateResponse to_proto(const RequestOutput& o);

// A request with tool calls: `o`'s text through its choice's `tools`; `r` (to_proto(o)) then has
// the content as its text, the calls' pieces as tool_call_deltas and, on the choice's last
// message, the calls whole (finish_reason "tool_calls" when it stopped after calls).
void add_tool_calls(ChoiceToolCalls& tools, const RequestOutput& o, ::peregrine::v1::GenerateResponse& r);

// The HTTP status as a gRPC code (400/413/415 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404
// NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, else INTERNAL); the message "param:
// message", cut to 1 KiB (it travels in the HTTP/2 trailers, whose size is limited).
grpc::Status to_status(const ApiError& e);

// Runs `f` (returning a grpc::Status) and turns what it throws into a status, as the HTTP API
// turns it into an error response (current_api_error).
template <typename F>
grpc::Status guarded(F&& f) {
    try {
        return f();
    } catch (...) {
        return to_status(current_api_error());
    }
}

}  // namespace peregrine::server
