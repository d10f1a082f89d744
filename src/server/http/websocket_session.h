// The WebSocket side of a connection (internal to src/server/http): after a successful upgrade
// the TCP stream moves here from its HTTP session, with its connection slot.
#pragma once

#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <cstddef>
#include <string>

#include "server/http/connections.h"
#include "server/http/websocket.h"

namespace peregrine::server {

// Answers the handshake `upgrade` (101, with X-Request-Id `request_id`), registers the socket
// with its Connections (for close_websockets) and runs `setup` once the handshake is done.
// Messages over `max_message` bytes close the connection.
void start_websocket(boost::beast::tcp_stream&& stream, Connections::Slot slot,
                     boost::beast::http::request<boost::beast::http::string_body> upgrade,
                     const std::string& request_id, size_t max_message, WebSocketSetup setup);
// The same over TLS (wss://).
void start_websocket(boost::beast::ssl_stream<boost::beast::tcp_stream>&& stream, Connections::Slot slot,
                     boost::beast::http::request<boost::beast::http::string_body> upgrade,
                     const std::string& request_id, size_t max_message, WebSocketSetup setup);

}  // namespace peregrine::server
