// One HTTP/1.1 connection (internal to src/server/http): reads requests one at a time, hands
// each to the handler with an Exchange on the connection's strand, and writes the answer (a
// whole response, or server-sent events in chunks). Keeps a read pending while a response is
// under way so a client that leaves is noticed at once; answers 408, 413, 431, 501 and 503
// itself; hands the socket to a WebSocket session after an accepted upgrade.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include "server/http/connections.h"
#include "server/http/http_server.h"

namespace peregrine::server {

// Serves `socket` until it closes. `opts` and `handler` must outlive every connection.
void start_session(boost::asio::ip::tcp::socket socket, const HttpServerOptions& opts, const HttpHandler& handler,
                   Connections::Slot slot);
// The same over TLS: the handshake first (within opts.idle_timeout_s; a failed one closes the
// connection), then the session on the encrypted stream. `tls` must outlive every connection.
void start_tls_session(boost::asio::ip::tcp::socket socket, boost::asio::ssl::context& tls,
                       const HttpServerOptions& opts, const HttpHandler& handler, Connections::Slot slot);

}  // namespace peregrine::server
