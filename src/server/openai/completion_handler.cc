#include "core/error.h"
#include "server/openai/completion_job.h"
#include "server/openai/handlers.h"
#include "server/openai/response_json.h"

namespace peregrine::server {

void handle_completion(CompletionService& service, ApiCall& call, Endpoint endpoint) {
    CompletionParams params =
        parse_completion_params(call.body, endpoint, service.sampling_limits(), service.request_defaults());
    std::string id = str_cat(params.chat() ? "chatcmpl-" : "cmpl-", random_hex_id());
    AdmittedCompletion admitted = service.admit(call.caller, std::move(params), id);
    start_completion(service, std::move(admitted), std::move(id), call.ex);
}

}  // namespace peregrine::server
