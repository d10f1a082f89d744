// The handlers of the API's routes (which path calls which: OpenAiServer's route table). Each
// answers through call.ex and throws ApiError for the caller to turn into an error response.
#pragma once

#include "server/openai/completion_request.h"
#include "server/openai/completion_service.h"
#include "server/openai/route_table.h"

namespace peregrine::server {

// GET /health: 200 {"status": "ok", engine and server figures}; 503 while loading or draining.
void handle_health(CompletionService& service, ApiCall& call);
// GET /ping (vLLM, SageMaker): 200 with an empty body once serving; 503 while loading or draining.
void handle_ping(CompletionService& service, ApiCall& call);
void handle_ui(CompletionService& service, ApiCall& call);  // GET /: the chat page
// GET /version: {"version": "..."}, as vLLM.
void handle_version(CompletionService& service, ApiCall& call);
// GET /metrics: the Prometheus exposition.
void handle_metrics(CompletionService& service, ApiCall& call);
// GET /v1/models (call.arg empty: the list) and /v1/models/{id}.
void handle_models(CompletionService& service, ApiCall& call);
// POST /tokenize {prompt | messages, ...} and /detokenize {tokens}.
void handle_tokenize(CompletionService& service, ApiCall& call);
void handle_detokenize(CompletionService& service, ApiCall& call);
// POST /v1/completions and /v1/chat/completions (and their /v1/ws messages): the body parsed
// into a CompletionParams, admitted, and answered by a completion job.
void handle_completion(CompletionService& service, ApiCall& call, Endpoint endpoint);
// POST /v1/responses: the body read as a chat request (responses_request.h), admitted like one,
// answered through a ResponsesExchange (responses_exchange.h).
void handle_response(CompletionService& service, ApiCall& call);
// POST /v1/embeddings (serve --task embed): the inputs pooled by the engine into vectors
// (embeddings_handler.cc); 400 on a server that generates.
void handle_embeddings(CompletionService& service, ApiCall& call);
// GET /v1/responses/{id}: 404, as nothing is stored.
void handle_stored_response(CompletionService& service, ApiCall& call);

}  // namespace peregrine::server
