#include "core/error.h"
#include "server/openai/completion_job.h"
#include "server/openai/handlers.h"
#include "server/openai/response_json.h"
#include "server/openai/responses_exchange.h"
#include "server/openai/responses_request.h"

namespace peregrine::server {

namespace {

// A request without `prompt_cache_key` may name its conversation by the X-Session-ID header (the
// session key of vLLM's router and llm-d): its blocks are then kept as a conversation's.
void take_session_header(const ApiCall& call, CompletionParams& params) {
    if (params.prompt_cache_key.empty() && call.http) params.prompt_cache_key = call.http->header("x-session-id");
}

}  // namespace

void handle_completion(CompletionService& service, ApiCall& call, Endpoint endpoint) {
    service.check_generates();  // before the body's fields: an embedding server says what it is
    CompletionParams params =
        parse_completion_params(call.body, endpoint, service.sampling_limits(), service.request_defaults());
    take_session_header(call, params);
    std::string id = str_cat(params.chat() ? "chatcmpl-" : "cmpl-", random_hex_id());
    AdmittedCompletion admitted = service.admit(call.caller, std::move(params), id);
    start_completion(service, std::move(admitted), std::move(id), call.ex);
}

void handle_response(CompletionService& service, ApiCall& call) {
    try {
        service.check_generates();
        ResponsesRequest r = parse_responses_request(call.body);
        CompletionParams params = parse_completion_params(r.chat_body, Endpoint::ChatCompletions,
                                                          service.sampling_limits(), service.request_defaults());
        take_session_header(call, params);
        std::string id = str_cat("resp_", random_hex_id());
        std::string model = params.model.empty() ? service.model_name() : params.model;
        AdmittedCompletion admitted = service.admit(call.caller, std::move(params), id);
        start_completion(service, std::move(admitted), id,
                         make_responses_exchange(call.ex, id, std::move(model), std::move(r.echoed)));
    } catch (const ApiError& e) {
        throw responses_error(e);
    }
}

void handle_stored_response(CompletionService& /*service*/, ApiCall& call) {
    throw ApiError(404,
                   str_cat("no response '", call.arg,
                           "': this server keeps no responses (every response is answered with store false)"),
                   "response_id", "not_found");
}

}  // namespace peregrine::server
