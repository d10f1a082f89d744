// The answering side of one request: a whole response at once (respond), or server-sent
// events (start_events, send_event, end_events). The HTTP connection implements it
// (session.cc); so does one request multiplexed on a WebSocket (openai/websocket_api.cc), and
// the middleware wraps it (middleware.h). Handlers write to an Exchange and never learn which.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "server/http/request.h"
#include "server/http/websocket.h"

namespace peregrine::server {

class Exchange {
  public:
    virtual ~Exchange() = default;
    // Any thread: runs `fn` on the connection's strand (dropped if the server has stopped).
    virtual void post(std::function<void()> fn) = 0;

    // Strand only. A whole response; ends the exchange.
    virtual void respond(int status, std::string body, std::string content_type = "application/json",
                         const HeaderList& extra = {}) = 0;
    // Strand only. 200 text/event-stream (chunked), then `data: <data>\n\n` per event, then the end.
    virtual void start_events(const HeaderList& extra = {}) = 0;
    virtual void send_event(std::string_view data) = 0;
    virtual void end_events() = 0;

    // Strand only. Called once if the client disconnects before the response is complete.
    virtual void on_client_gone(std::function<void()> fn) = 0;
    virtual bool client_gone() const = 0;

    // Strand only. The token counts of the request being answered, for whoever records it.
    virtual void note_usage(int /*prompt_tokens*/, int /*completion_tokens*/) {}

    // Strand only. Where the client can cancel a request and stay connected (WebSocket), `fn`
    // aborts the request; its answer still ends normally (finish reason "abort").
    virtual void on_cancel(std::function<void()> /*fn*/) {}

    // Strand only, for a request with websocket_upgrade: answers 101 Switching Protocols and
    // turns the connection into a WebSocket (then `setup` runs). Ends the exchange.
    virtual void accept_websocket(WebSocketSetup setup) = 0;
};

// Called on the connection's strand; must answer through the exchange (now or later).
using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<Exchange>)>;

}  // namespace peregrine::server
