// HTTP/1.1 with keep-alive on a pool of I/O threads (Boost.Beast over Asio). Each connection
// runs on its own strand (session.cc); a handler gets each request on that strand together with
// an Exchange through which it answers, at once or as server-sent events. While a request is
// being answered the connection keeps a read pending, so a client that goes away is noticed at
// once (Exchange::on_client_gone). Every response carries X-Request-Id: the client's own
// (printable, up to 128 bytes) or a new one. A WebSocket upgrade request reaches the handler like
// any other (websocket_upgrade set); the handler refuses it with respond, or takes it with
// Exchange::accept_websocket, and the connection becomes a WebSocket (websocket_session.cc).
//
// Beast stays inside src/server/http/*.cc; this header and exchange.h are all the rest of the
// server sees.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/http/exchange.h"
#include "server/tls_options.h"

namespace peregrine::server {

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
    TlsOptions tls;  // every connection through TLS when enabled
};

// The connection cap used when none is given: the process's descriptor limit less a reserve
// for model files, gRPC and logs.
int default_max_connections();

// Loads `tls`'s files as the server will (throws Error naming the flag and OpenSSL's reason):
// lets a command check them before it does anything slow.
void check_tls_files(const TlsOptions& tls);

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
