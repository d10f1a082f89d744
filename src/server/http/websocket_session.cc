#include "server/http/websocket_session.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>

namespace peregrine::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;

// What Connections keeps of a WebSocket, whatever its transport.
class WsSession : public WebSocket {
  public:
    virtual void close_with(websocket::close_code code) = 0;
};

namespace {

// A connection after its upgrade: one read always pending, writes one at a time from a queue.
// Stream: beast::tcp_stream, or beast::ssl_stream of one (wss://).
template <class Stream>
class WsStream final : public WsSession, public std::enable_shared_from_this<WsStream<Stream>> {
    using std::enable_shared_from_this<WsStream<Stream>>::shared_from_this;

  public:
    WsStream(Stream&& stream, Connections::Slot slot) : ws_(std::move(stream)), slot_(std::move(slot)) {}

    void start(http::request<http::string_body> req, const std::string& request_id, size_t max_message,
               WebSocketSetup setup) {
        req_ = std::move(req);
        setup_ = std::move(setup);
        ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
        // A client that offers subprotocols must get one back or browsers drop the connection:
        // the first that does not carry an API key (openai-insecure-api-key.KEY), else the first.
        std::string protocol;
        const auto field = req_[http::field::sec_websocket_protocol];
        for (std::string_view offered(field.data(), field.size()); !offered.empty();) {
            const size_t comma = offered.find(',');
            std::string_view p = offered.substr(0, comma);
            offered = comma == std::string_view::npos ? std::string_view() : offered.substr(comma + 1);
            while (!p.empty() && p.front() == ' ') p.remove_prefix(1);
            while (!p.empty() && p.back() == ' ') p.remove_suffix(1);
            if (p.empty()) continue;
            if (protocol.empty()) protocol = p;
            if (!p.starts_with("openai-insecure-api-key.")) {
                protocol = p;
                break;
            }
        }
        ws_.set_option(websocket::stream_base::decorator([request_id, protocol](websocket::response_type& res) {
            res.set("X-Request-Id", request_id);
            if (!protocol.empty()) res.set(http::field::sec_websocket_protocol, protocol);
        }));
        ws_.read_message_max(max_message);
        ws_.async_accept(req_, [self = shared_from_this()](beast::error_code ec) { self->on_accept(ec); });
    }

    void post(std::function<void()> fn) override { net::post(ws_.get_executor(), std::move(fn)); }

    void send(std::string text) override {
        if (closed_ || closing_) return;
        queue_.push_back(std::move(text));
        if (!writing_) do_write();
    }

    void close() override { close_with(websocket::close_code::normal); }

    // Strand only. The close frame carries `code` (1001 "going away" when the server stops).
    void close_with(websocket::close_code code) override {
        if (closed_ || closing_) return;
        closing_ = true;
        close_code_ = code;
        if (!writing_) do_close();
    }

    bool closed() const override { return closed_; }
    Connections* connections() const { return slot_.owner(); }

  private:
    void on_accept(beast::error_code ec) {
        req_ = {};
        if (ec) {
            setup_ = nullptr;
            closed_ = true;
            return;
        }
        auto setup = std::move(setup_);
        setup_ = nullptr;
        callbacks_ = setup(shared_from_this());
        do_read();
    }

    void do_read() {
        ws_.async_read(rbuf_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        if (ec) return finish();
        std::string msg = beast::buffers_to_string(rbuf_.data());
        rbuf_.consume(rbuf_.size());
        try {
            if (callbacks_.on_message) callbacks_.on_message(std::move(msg));
        } catch (const std::exception& e) {  // a bug in a handler must not stop this connection's reads
            std::fprintf(stderr, "server: WebSocket handler failed: %s\n", e.what());
        }
        if (!closed_) do_read();
    }

    void do_write() {
        writing_ = true;
        ws_.text(true);
        ws_.async_write(net::buffer(queue_.front()),
                        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
    }

    void on_write(beast::error_code ec) {
        writing_ = false;
        if (!queue_.empty()) queue_.pop_front();
        if (ec) return finish();
        if (!queue_.empty() && !closed_) return do_write();
        if (closing_ && !closed_) do_close();
    }

    void do_close() {
        const websocket::close_reason reason(close_code_,
                                             close_code_ == websocket::close_code::going_away ? "going away" : "");
        ws_.async_close(reason, [self = shared_from_this()](beast::error_code) { self->finish(); });
    }

    // The connection ended (either side, or an error): tell the owner once, then forget it.
    void finish() {
        if (closed_) return;
        closed_ = true;
        queue_.clear();
        beast::error_code ec;
        beast::get_lowest_layer(ws_).socket().close(ec);  // no-op after a clean close handshake
        auto on_close = std::move(callbacks_.on_close);
        callbacks_ = {};
        if (on_close) on_close();
    }

    websocket::stream<Stream> ws_;
    Connections::Slot slot_;
    websocket::close_code close_code_ = websocket::close_code::normal;
    http::request<http::string_body> req_;  // the handshake, until accepted
    WebSocketSetup setup_;
    WebSocketCallbacks callbacks_;
    beast::flat_buffer rbuf_;
    std::deque<std::string> queue_;  // front: being written
    bool writing_ = false;
    bool closing_ = false;
    bool closed_ = false;
};

template <class Stream>
void start(Stream&& stream, Connections::Slot slot, http::request<http::string_body> upgrade,
           const std::string& request_id, size_t max_message, WebSocketSetup setup) {
    auto ws = std::make_shared<WsStream<Stream>>(std::move(stream), std::move(slot));
    if (Connections* c = ws->connections()) {
        std::lock_guard<std::mutex> lock(c->mu);
        std::erase_if(c->websockets, [](const std::weak_ptr<WsSession>& w) { return w.expired(); });
        c->websockets.push_back(ws);
    }
    ws->start(std::move(upgrade), request_id, max_message, std::move(setup));
}

}  // namespace

void start_websocket(beast::tcp_stream&& stream, Connections::Slot slot, http::request<http::string_body> upgrade,
                     const std::string& request_id, size_t max_message, WebSocketSetup setup) {
    start(std::move(stream), std::move(slot), std::move(upgrade), request_id, max_message, std::move(setup));
}

void start_websocket(beast::ssl_stream<beast::tcp_stream>&& stream, Connections::Slot slot,
                     http::request<http::string_body> upgrade, const std::string& request_id, size_t max_message,
                     WebSocketSetup setup) {
    start(std::move(stream), std::move(slot), std::move(upgrade), request_id, max_message, std::move(setup));
}

void Connections::close_websockets() {
    std::vector<std::shared_ptr<WsSession>> live;
    {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& w : websockets)
            if (auto ws = w.lock()) live.push_back(std::move(ws));
    }
    for (auto& ws : live) ws->post([ws] { ws->close_with(websocket::close_code::going_away); });
}

}  // namespace peregrine::server
