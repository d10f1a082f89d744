// GET /v1/ws: many streamed completions over one WebSocket. Each text message
//   {"id": "<client's id>", "type": "completion" | "chat", "request": {<the REST body>}}
// is dispatched through the route table (the route whose ws_type is `type`), checked as the
// handshake's caller, and answered by {"id", "type": "chunk", "data": <SSE chunk>} ...
// {"id", "type": "done"}, or {"id", "type": "error", "error", "status"}. {"type": "cancel",
// "id"} aborts one (its answer ends with finish reason "abort"); closing the socket aborts all.
#pragma once

#include <memory>
#include <string>

#include "server/openai/completion_service.h"
#include "server/openai/route_table.h"

namespace peregrine::server {

struct WsConnection;

// A WebSocket handshake's API key as the Authorization header it stands for: the header itself,
// else the subprotocol `openai-insecure-api-key.KEY`, else the query `api_key=KEY` (browsers
// cannot set headers on a WebSocket); "" without one.
std::string websocket_authorization(const HttpRequest& req);

class WebSocketApi {
  public:
    // Both must outlive every connection.
    WebSocketApi(CompletionService& service, const RouteTable& routes) : service_(service), routes_(routes) {}

    // The /v1/ws route: 426 (not an upgrade, or not version 13) or 400 (bad key) as JSON, else
    // the upgrade is accepted and the connection's messages come to on_message.
    void accept(const ApiCall& call);

  private:
    void on_message(const std::shared_ptr<WsConnection>& conn, const std::string& text);

    CompletionService& service_;
    const RouteTable& routes_;
};

}  // namespace peregrine::server
