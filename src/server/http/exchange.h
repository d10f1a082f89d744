// The answering side of one request: a whole response at once (respond), or server-sent
// events (start_events, send_event, end_events). The HTTP connection implements it
// (session.cc); so does one request multiplexed on a WebSocket (openai/websocket_api.cc), and
// the middleware wraps it (middleware.h). Handlers write to an Exchange and never learn which.
#pragma once

#include <boost/asio/any_io_executor.hpp>
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
    // Strand only, after start_events. Whole events already framed (`data: ...\n\n`, each
    // ending in a blank line), as a proxy passes a replica's stream on. The default splits them
    // into send_event calls; the HTTP connection appends the bytes as they are.
    virtual void send_framed_events(std::string_view framed);

    // The connection's strand as an executor, or a null one where there is none. A handler that
    // runs its own I/O for this exchange (the router's upstream connection) runs it there: in
    // order with the exchange's calls, which it may then make directly, with no hop between
    // threads for every event.
    virtual boost::asio::any_io_executor executor() const { return {}; }

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

inline void Exchange::send_framed_events(std::string_view framed) {
    size_t start = 0;
    for (size_t end; (end = framed.find("\n\n", start)) != std::string_view::npos; start = end + 2) {
        std::string data;  // the event's data lines, joined by '\n'
        for (size_t line = start; line < end;) {
            size_t nl = framed.find('\n', line);
            if (nl == std::string_view::npos || nl > end) nl = end;
            std::string_view l = framed.substr(line, nl - line);
            if (l.rfind("data:", 0) == 0) {
                l.remove_prefix(l.size() > 5 && l[5] == ' ' ? 6 : 5);
                if (!data.empty()) data += '\n';
                data += l;
            }
            line = nl + 1;
        }
        send_event(data);
    }
}

// Called on the connection's strand; must answer through the exchange (now or later).
using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<Exchange>)>;

}  // namespace peregrine::server
