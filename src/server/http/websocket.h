// A WebSocket connection as the server's handlers see it (Beast stays in websocket_session.cc):
// text messages in through callbacks, text messages out through send(), all on the strand of
// the TCP connection it was upgraded from.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace peregrine::server {

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

}  // namespace peregrine::server
