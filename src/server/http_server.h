// HTTP/1.1 with keep-alive on a pool of I/O threads (Boost.Beast over Asio). Each connection
// runs on its own strand; a handler gets each request on that strand together with an
// Exchange through which it answers, at once (respond) or as server-sent events (start_events,
// send_event, end_events), from the strand. Work arriving from other threads reaches the strand
// through Exchange::post. While a request is being answered the connection keeps a read
// pending, so a client that goes away is noticed at once (on_client_gone). Every response carries
// X-Request-Id: the client's own (printable, up to 128 bytes) or a new one. A WebSocket upgrade
// request reaches the handler like any other (websocket_upgrade set); the handler refuses it with
// respond, or takes it with Exchange::accept_websocket, and the connection becomes a WebSocket.
//
// Beast stays inside http_server.cc; this header is all the rest of the server sees.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace peregrine::server {

struct HttpRequest {
    std::string method;                                        // "GET", "POST", ...
    std::string path;                                          // the target without its query
    std::string query;                                         // after '?', undecoded
    std::vector<std::pair<std::string, std::string>> headers;  // names lower case
    std::string body;
    std::string remote;              // "ip:port"
    std::string request_id;          // the client's X-Request-Id, else a new one; sent back with the response
    bool websocket_upgrade = false;  // a WebSocket handshake (GET with Upgrade: websocket)

    // The first header named `lower_name`, "" when absent.
    std::string_view header(std::string_view lower_name) const;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// A WebSocket connection (one upgraded request), living on the strand of its TCP connection.
class WebSocket {
  public:
    virtual ~WebSocket() = default;
    // Any thread: runs `fn` on the connection's strand (dropped if the server has stopped).
    virtual void post(std::function<void()> fn) = 0;
    // Strand only. Queues one text message; messages go out in order. Dropped once closed.
    virtual void send(std::string text) = 0;
    // Strand only. Sends the close frame once the queued messages are out.
    virtual void close() = 0;
    virtual bool closed() const = 0;
};

struct WebSocketCallbacks {
    std::function<void(std::string message)> on_message;  // strand; each message received
    std::function<void()> on_close;                       // strand; once, when the connection ends
};
// Called on the strand once the handshake succeeded; returns the connection's callbacks.
using WebSocketSetup = std::function<WebSocketCallbacks(std::shared_ptr<WebSocket>)>;

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

struct HttpServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;                           // 0: any free port (see HttpServer::port)
    int io_threads = 0;                        // 0: min(4, cores), at least 2
    size_t max_body_bytes = size_t{32} << 20;  // larger bodies get 413
    int idle_timeout_s = 60;                   // a connection with no (complete) request header is closed
                                               // (408 when part of one arrived)
    int read_timeout_s = 60;                   // a body not complete this long after its header: 408
    int max_connections = 0;                   // open connections (WebSockets too); beyond: 503 and close;
                                               // 0: from the descriptor limit (default_max_connections)
    // Request bodies being received or handled at once, by their declared size (a chunked body
    // counts as max_body_bytes); one that would pass it gets 503 before its body is read.
    size_t max_pending_body_bytes = size_t{256} << 20;
};

// The connection cap used when none is given: the process's descriptor limit less a reserve
// for model files, gRPC and logs.
int default_max_connections();

class HttpServer {
  public:
    HttpServer(HttpServerOptions options, HttpHandler handler);
    ~HttpServer();  // stop()
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds and listens (throws Error when it cannot), starts the I/O threads.
    void start();
    // The bound port (after start).
    int port() const;
    // Open connections (plain and WebSocket).
    int num_connections() const;
    // Sends every open WebSocket a Close frame 1001 "going away" (after what is queued on it).
    void close_websockets();
    // Stops accepting, closes every connection, joins the I/O threads.
    void stop();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace peregrine::server
