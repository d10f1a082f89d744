// Answers one admitted completion request on its Exchange: submits its engine Requests, gathers
// their outputs as the stream pump delivers them (on the exchange's strand), and writes the
// OpenAI answer: one JSON body (text_completion / chat.completion), or server-sent events chunk
// by chunk (text_completion / chat.completion.chunk, then the usage when asked, then [DONE]).
// A client that goes away aborts the requests; one that cancels (WebSocket) still gets its
// answer, ended with finish reason "abort".
#pragma once

#include <memory>
#include <string>

#include "server/http/exchange.h"
#include "server/openai/completion_service.h"

namespace peregrine::server {

// `id` is the response's id ("cmpl-..." / "chatcmpl-..."), the one `admitted` was built with.
// Throws ApiError (nothing left running, nothing sent) when the engine refuses a request.
void start_completion(CompletionService& service, AdmittedCompletion admitted, std::string id,
                      std::shared_ptr<Exchange> ex);

}  // namespace peregrine::server
