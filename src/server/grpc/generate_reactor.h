// One streaming Generate call: engine outputs arrive from the StreamPump thread and are written
// one message at a time; a cancel (client gone, deadline passed) aborts the engine request; the
// call's access-log line is written when it ends.
#pragma once

#include <grpcpp/support/server_callback.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "peregrine/v1/inference.pb.h"
#include "server/openai/completion_service.h"
#include "server/openai/tool_call_stream.h"

namespace peregrine::server {

// The reactor of one Generate call from `peer`. Its clock starts now; `submit` then admits the
// request and hands it to the engine, returning its stream (and setting *ticket, held until the
// last output, and *tools when the request's choices carry tool calls); what `submit` throws
// ends the call with that error's status before any message.
grpc::ServerWriteReactor<::peregrine::v1::GenerateResponse>* start_generate(
    CompletionService& service, std::string peer,
    const std::function<std::shared_ptr<RequestStream>(Ticket*, std::optional<ToolCallSetup>*)>& submit);

}  // namespace peregrine::server
