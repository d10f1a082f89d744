// The OpenAI-compatible HTTP API: the route table, and around it CORS, JSON access logs, API
// keys and rate limits (through the CompletionService's admission), and the error responses.
//
//   POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize
//   GET  /v1/models, /v1/models/{id}, /health (503 until set_model, and while draining), /metrics
//   GET  /v1/ws: a WebSocket carrying many streamed completions (websocket_api.h)
//   OPTIONS (CORS preflight from an allowed origin)
//
// What a request asks for is handled by the shared CompletionService (completion_service.h),
// the same one the gRPC API (grpc/grpc_server.h) serves from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/http/exchange.h"
#include "server/middleware.h"
#include "server/openai/completion_service.h"
#include "server/openai/route_table.h"
#include "server/openai/server_options.h"
#include "server/openai/websocket_api.h"
#include "server/served_model.h"

namespace peregrine::server {

class OpenAiServer {
  public:
    explicit OpenAiServer(OpenAiServerOptions options);
    ~OpenAiServer();  // shutdown()

    // The model is loaded: start answering (until then everything but /health is 503).
    void set_model(std::unique_ptr<ServedModel> model) { service_->set_model(std::move(model)); }
    // Called on a connection's strand for each request (the HttpServer's handler).
    void handle(const HttpRequest& req, std::shared_ptr<Exchange> ex);
    // Aborts what is running, stops the engine and the pump.
    void shutdown() { service_->shutdown(); }

    // Graceful shutdown: /health answers 503 "draining" and new API requests 503; running ones go on.
    void begin_drain() { service_->begin_drain(); }
    // Completion requests still being answered (every transport).
    int64_t in_flight() const { return service_->in_flight(); }
    // Ends every running request now (finish reason "abort"); their answers still go out.
    void abort_all() { service_->abort_all(); }

    const std::string& model_name() const { return service_->model_name(); }
    // What every transport serves from (the gRPC API takes it too).
    const std::shared_ptr<CompletionService>& service() const { return service_; }

  private:
    // Routes `req` through the table: the caller's access, the method, the body, the handler;
    // what they throw becomes the error response.
    void dispatch(const HttpRequest& req, const std::shared_ptr<Exchange>& ex);

    std::shared_ptr<CompletionService> service_;
    std::string root_path_;  // without a trailing '/'
    CorsPolicy cors_;
    RouteTable routes_;
    WebSocketApi websocket_;
};

}  // namespace peregrine::server
