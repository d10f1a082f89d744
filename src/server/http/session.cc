#include "server/http/session.h"

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <cstdio>
#include <optional>

#include "core/error.h"
#include "server/http/sse.h"
#include "server/http/websocket_session.h"

namespace peregrine::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr size_t kMaxReadAhead = 1 << 20;  // bytes read while a response is under way (pipelining)

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

template <class Stream>
class Session;

template <class Stream>
class SessionExchange final : public Exchange {
  public:
    SessionExchange(std::shared_ptr<Session<Stream>> s, uint64_t gen) : s_(std::move(s)), gen_(gen) {}
    void post(std::function<void()> fn) override;
    void respond(int status, std::string body, std::string content_type, const HeaderList& extra) override;
    void start_events(const HeaderList& extra) override;
    void send_event(std::string_view data) override;
    void send_framed_events(std::string_view framed) override;
    void end_events() override;
    void on_client_gone(std::function<void()> fn) override;
    bool client_gone() const override;
    void accept_websocket(WebSocketSetup setup) override;
    boost::asio::any_io_executor executor() const override;

  private:
    std::shared_ptr<Session<Stream>> s_;
    uint64_t gen_;
};

// Stream: beast::tcp_stream (plain HTTP) or TlsStream (HTTPS, its handshake done).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
    static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
    using std::enable_shared_from_this<Session<Stream>>::shared_from_this;

  public:
    Session(Stream&& stream, const HttpServerOptions& opts, const HttpHandler& handler, Connections::Slot slot)
        : stream_(std::move(stream)),
          opts_(opts),
          handler_(handler),
          slot_(std::move(slot)),
          conns_(slot_.owner()),
          read_timer_(stream_.get_executor()) {
        beast::error_code ec;
        const auto ep = socket().remote_endpoint(ec);
        if (!ec) remote_ = str_cat(ep.address().to_string(), ":", ep.port());
    }

    void run() {
        net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
    }

  private:
    friend class SessionExchange<Stream>;

    tcp::socket& socket() { return beast::get_lowest_layer(stream_).socket(); }

    // --- reading requests ---------------------------------------------------------------
    void do_read() {
        parser_.emplace();
        parser_->body_limit(opts_.max_body_bytes);
        parser_->header_limit(kMaxHeaderBytes);
        arm_read_timer(opts_.idle_timeout_s);
        http::async_read_header(stream_, buffer_, *parser_,
                                [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
    }

    // A deadline for reading one request: when it passes, the pending read is cancelled and
    // on_read_error answers 408 (some of the request came) or closes (none did). Beast's own
    // stream timeout would close the socket before a 408 could be sent.
    void arm_read_timer(int seconds) {
        const uint64_t gen = ++timer_gen_;
        read_timer_.expires_after(std::chrono::seconds(seconds));
        read_timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
            if (ec || gen != self->timer_gen_ || self->gone_) return;
            self->timed_out_ = true;
            beast::error_code ignored;
            self->socket().cancel(ignored);
        });
    }
    void disarm_read_timer() {
        ++timer_gen_;
        read_timer_.cancel();
    }

    void on_header(beast::error_code ec) {
        if (ec) return on_read_error(ec);
        disarm_read_timer();
        auto& req = parser_->get();
        // Only the chunked coding is understood (RFC 9112 6.1: 501 for any other).
        if (req.count(http::field::transfer_encoding) > 0 &&
            (req.count(http::field::transfer_encoding) > 1 ||
             !beast::iequals(req[http::field::transfer_encoding], "chunked")))
            return respond_and_close(
                501, error_json(501, "only 'Transfer-Encoding: chunked' is supported", "not_implemented"));
        head_ = req.method() == http::verb::head;
        const auto length = parser_->content_length();
        const int64_t body =
            parser_->chunked() ? static_cast<int64_t>(opts_.max_body_bytes) : static_cast<int64_t>(length.value_or(0));
        if (body > static_cast<int64_t>(opts_.max_body_bytes)) return on_read_error(http::error::body_limit);
        if (!conns_->reserve_body(body, static_cast<int64_t>(opts_.max_pending_body_bytes))) {
            std::string busy =
                error_json(503, "the server is receiving too many large requests; retry shortly", "server_busy");
            return respond_and_close(503, std::move(busy), {{"Retry-After", "1"}});
        }
        body_reserved_ = body;
        auto expect = req[http::field::expect];
        if (beast::iequals(expect, "100-continue")) {
            inflight_ = "HTTP/1.1 100 Continue\r\n\r\n";
            net::async_write(stream_, net::buffer(inflight_),
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                                 if (ec) return self->close();
                                 self->read_body();
                             });
            return;
        }
        read_body();
    }

    void read_body() {
        arm_read_timer(opts_.read_timeout_s);
        http::async_read(stream_, buffer_, *parser_,
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
    }

    void on_read_error(beast::error_code ec) {
        disarm_read_timer();
        release_body();
        if (timed_out_) {
            timed_out_ = false;
            // Part of a request arrived, the rest did not in time (a stalled or trickled request).
            if (parser_ && (parser_->got_some() || buffer_.size() > 0))
                return respond_and_close(408,
                                         error_json(408, "the request was not received in time", "request_timeout"));
            return close();  // an idle keep-alive connection
        }
        if (ec == http::error::body_limit) {
            return respond_and_close(
                413, error_json(413, "the request body is larger than the server accepts", "request_too_large"));
        }
        if (ec == http::error::header_limit) {
            return respond_and_close(431, error_json(431, "the request headers are too large", "headers_too_large"));
        }
        if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
            ec != http::error::end_of_stream && ec != http::error::partial_message) {
            return respond_and_close(400, error_json(400, "malformed HTTP request", "bad_request"));
        }
        close();  // end of stream, timeout, reset
    }

    void on_body(beast::error_code ec) {
        if (ec) return on_read_error(ec);
        disarm_read_timer();
        auto& req = parser_->get();
        HttpRequest r;
        r.method = std::string(req.method_string());
        const std::string_view target(req.target().data(), req.target().size());
        const size_t q = target.find('?');
        r.path = std::string(target.substr(0, q));
        if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
        for (const auto& f : req)
            r.headers.emplace_back(lower(std::string_view(f.name_string().data(), f.name_string().size())),
                                   std::string(f.value()));
        r.body = std::move(req.body());
        r.websocket_upgrade = websocket::is_upgrade(req);
        r.remote = remote_;
        r.request_id = std::string(r.header("x-request-id"));
        const bool printable =
            std::all_of(r.request_id.begin(), r.request_id.end(), [](char c) { return c > ' ' && c < 127; });
        if (r.request_id.empty() || r.request_id.size() > 128 || !printable) r.request_id = new_request_id();
        request_id_ = r.request_id;
        keep_alive_ = req.keep_alive();
        http11_ = req.version() >= 11;
        if (r.websocket_upgrade)
            upgrade_.emplace(parser_->release());  // a client sends nothing more before the answer
        else
            upgrade_.reset();
        parser_.reset();
        begin_exchange(/*watch=*/!r.websocket_upgrade);
        auto ex = std::make_shared<SessionExchange<Stream>>(shared_from_this(), gen_);
        try {
            handler_(r, ex);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "server: handler failed on %s %s: %s\n", r.method.c_str(), r.path.c_str(), e.what());
            if (!finishing_ && !events_) respond(gen_, 500, error_json(500, "internal server error", "internal_error"));
        }
        r = HttpRequest();  // the body is parsed and tokenized by now: its bytes go back first
        release_body();
    }

    // --- one request/response -------------------------------------------------------------
    void begin_exchange(bool watch = true) {
        ++gen_;
        active_ = true;
        finishing_ = false;
        events_ = false;
        on_gone_ = nullptr;
        disarm_read_timer();
        beast::get_lowest_layer(stream_).expires_never();
        if (watch) start_watch();
    }

    // The socket moves to a WebSocket session; this one is done (no read is pending).
    void accept_websocket(uint64_t gen, WebSocketSetup setup) {
        if (gen != gen_ || !active_ || finishing_ || events_ || gone_ || !upgrade_ || watch_pending_ || writing_)
            return;
        active_ = false;
        gone_ = true;
        on_gone_ = nullptr;
        start_websocket(std::move(stream_), std::move(slot_), std::move(*upgrade_), request_id_, opts_.max_body_bytes,
                        std::move(setup));
        upgrade_.reset();
    }

    // A read kept pending while the response is under way: EOF or an error means the client left.
    void start_watch() {
        if (watch_pending_ || gone_ || buffer_.size() > kMaxReadAhead) return;
        watch_pending_ = true;
        stream_.async_read_some(buffer_.prepare(4096),
                                [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
    }

    void on_watch(beast::error_code ec, size_t n) {
        watch_pending_ = false;
        if (!ec) buffer_.commit(n);
        if (ec && ec != net::error::operation_aborted) return client_lost();
        if (active_) {
            if (!ec) start_watch();
            return;
        }
        if (gone_) return;
        // The exchange ended while this read was pending.
        if (keep_alive_)
            do_read();
        else
            drain();
    }

    void client_lost() {
        if (gone_) return;
        close();
        if (active_ && on_gone_) {
            auto fn = std::move(on_gone_);
            on_gone_ = nullptr;
            fn();
        }
    }

    void close() {
        release_body();
        if (gone_) return;
        gone_ = true;
        disarm_read_timer();
        beast::error_code ec;
        socket().shutdown(tcp::socket::shutdown_both, ec);
        socket().close(ec);
    }

    std::string head(int status, const std::string& content_type, const HeaderList& extra) const {
        std::string h = str_cat("HTTP/1.1 ", status, " ", http::obsolete_reason(static_cast<http::status>(status)),
                                "\r\nContent-Type: ", content_type, "\r\n");
        for (const auto& [k, v] : extra) h += str_cat(k, ": ", v, "\r\n");
        if (!request_id_.empty()) h += str_cat("X-Request-Id: ", request_id_, "\r\n");
        if (!keep_alive_)
            h += "Connection: close\r\n";
        else if (!http11_)
            h += "Connection: keep-alive\r\n";
        return h;
    }

    void respond(uint64_t gen, int status, std::string body, const std::string& content_type = "application/json",
                 const HeaderList& extra = {}) {
        if (gen != gen_ || !active_ || finishing_ || events_ || gone_) return;
        wire_ += head(status, content_type, extra);
        wire_ += str_cat("Content-Length: ", body.size(), "\r\n\r\n");
        if (!head_) wire_ += body;  // HEAD: what GET would answer, without the body
        finishing_ = true;
        do_write();
    }

    void respond_and_close(int status, std::string body, const HeaderList& extra = {}) {
        release_body();
        request_id_ = new_request_id();
        keep_alive_ = false;
        http11_ = true;
        head_ = false;
        parser_.reset();
        begin_exchange();
        respond(gen_, status, std::move(body), "application/json", extra);
    }

    void release_body() {
        if (body_reserved_ == 0) return;
        conns_->release_body(body_reserved_);
        body_reserved_ = 0;
    }

    void start_events(uint64_t gen, const HeaderList& extra) {
        if (gen != gen_ || !active_ || finishing_ || events_ || gone_) return;
        events_ = true;
        if (!http11_) keep_alive_ = false;  // no chunked encoding: the body ends with the connection
        wire_ += head(200, "text/event-stream; charset=utf-8", extra);
        wire_ += kEventStreamHeaders;
        wire_ += http11_ ? "Transfer-Encoding: chunked\r\n\r\n" : "\r\n";
        do_write();
    }

    void send_event(uint64_t gen, std::string_view data) {
        if (gen != gen_ || !active_ || finishing_ || !events_ || gone_) return;
        append_sse_event(body_, data);
        do_write();
    }

    void send_framed_events(uint64_t gen, std::string_view framed) {
        if (gen != gen_ || !active_ || finishing_ || !events_ || gone_) return;
        body_ += framed;
        do_write();
    }

    void end_events(uint64_t gen) {
        if (gen != gen_ || !active_ || finishing_ || !events_ || gone_) return;
        finishing_ = true;
        if (http11_) tail_ = kLastChunk;
        do_write();
    }

    void do_write() {
        if (writing_ || gone_) return;
        std::string out = std::move(wire_);
        wire_.clear();
        if (!body_.empty()) {
            if (http11_)
                append_chunk(out, body_);
            else
                out += body_;
            body_.clear();
        }
        out += tail_;
        tail_.clear();
        if (out.empty()) {
            if (finishing_ && active_) finish_exchange();
            return;
        }
        inflight_ = std::move(out);
        writing_ = true;
        net::async_write(stream_, net::buffer(inflight_),
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
    }

    void on_write(beast::error_code ec) {
        writing_ = false;
        inflight_.clear();
        if (ec) return client_lost();
        do_write();
    }

    void finish_exchange() {
        active_ = false;
        on_gone_ = nullptr;
        if (!keep_alive_) return linger_close();
        if (watch_pending_) {  // on_watch continues with do_read
            beast::error_code ec;
            socket().cancel(ec);
            return;
        }
        do_read();
    }

    // Connection: close: stop sending, read (and drop) what the client still sends for a while,
    // so that it sees the response rather than a reset.
    // Over TLS the whole response is in the client's hands once written (its length or last
    // chunk ends it): close at once.
    void linger_close() {
        beast::error_code ec;
        if constexpr (kTls) return close();
        socket().shutdown(tcp::socket::shutdown_send, ec);
        beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(2));
        if (watch_pending_) {  // on_watch continues with drain
            socket().cancel(ec);
            return;
        }
        drain();
    }

    void drain() {
        if (gone_) return;
        stream_.async_read_some(net::buffer(drain_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->close();
            self->drain();
        });
    }

    Stream stream_;
    const HttpServerOptions& opts_;
    const HttpHandler& handler_;
    Connections::Slot slot_;  // handed to the WebSocket after an upgrade
    Connections* const conns_;
    net::steady_timer read_timer_;
    uint64_t timer_gen_ = 0;  // which arming is current (a fired wait of an older one does nothing)
    bool timed_out_ = false;
    std::string remote_;
    std::string request_id_;  // of the current exchange
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::optional<http::request<http::string_body>> upgrade_;  // a WebSocket handshake being answered

    uint64_t gen_ = 0;        // which exchange is current
    bool active_ = false;     // a request is being answered
    bool finishing_ = false;  // its last bytes are queued
    bool events_ = false;     // answering with server-sent events
    bool keep_alive_ = true;
    bool http11_ = true;
    bool head_ = false;          // answering HEAD: no body
    int64_t body_reserved_ = 0;  // of Connections::body_bytes, for the request being read
    bool gone_ = false;          // the socket is closed
    bool watch_pending_ = false;
    bool writing_ = false;
    std::function<void()> on_gone_;

    std::string wire_;      // framed bytes to send (status line and headers, whole responses)
    std::string body_;      // event data to send as one chunk
    std::string tail_;      // the last chunk
    std::string inflight_;  // what async_write is sending
    std::array<char, 4096> drain_buf_;
};

template <class Stream>
void SessionExchange<Stream>::post(std::function<void()> fn) {
    net::post(s_->stream_.get_executor(), std::move(fn));
}
template <class Stream>
void SessionExchange<Stream>::respond(int status, std::string body, std::string content_type, const HeaderList& extra) {
    s_->respond(gen_, status, std::move(body), content_type, extra);
}
template <class Stream>
void SessionExchange<Stream>::start_events(const HeaderList& extra) {
    s_->start_events(gen_, extra);
}
template <class Stream>
void SessionExchange<Stream>::send_event(std::string_view data) {
    s_->send_event(gen_, data);
}
template <class Stream>
void SessionExchange<Stream>::send_framed_events(std::string_view framed) {
    s_->send_framed_events(gen_, framed);
}
template <class Stream>
boost::asio::any_io_executor SessionExchange<Stream>::executor() const {
    return s_->stream_.get_executor();
}
template <class Stream>
void SessionExchange<Stream>::end_events() {
    s_->end_events(gen_);
}
template <class Stream>
void SessionExchange<Stream>::on_client_gone(std::function<void()> fn) {
    if (s_->gen_ != gen_ || !s_->active_) return;
    if (s_->gone_) return fn();
    s_->on_gone_ = std::move(fn);
}
template <class Stream>
bool SessionExchange<Stream>::client_gone() const {
    return s_->gone_;
}
template <class Stream>
void SessionExchange<Stream>::accept_websocket(WebSocketSetup setup) {
    s_->accept_websocket(gen_, std::move(setup));
}

}  // namespace

void start_session(tcp::socket socket, const HttpServerOptions& opts, const HttpHandler& handler,
                   Connections::Slot slot) {
    std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), opts, handler, std::move(slot))
        ->run();
}

void start_tls_session(tcp::socket socket, net::ssl::context& tls, const HttpServerOptions& opts,
                       const HttpHandler& handler, Connections::Slot slot) {
    auto stream = std::make_shared<TlsStream>(std::move(socket), tls);
    // A client gets the idle timeout to finish its handshake (one that never starts is closed).
    beast::get_lowest_layer(*stream).expires_after(std::chrono::seconds(opts.idle_timeout_s));
    auto s = std::make_shared<Connections::Slot>(std::move(slot));
    stream->async_handshake(net::ssl::stream_base::server, [stream, s, &opts, &handler](beast::error_code ec) {
        if (ec) {  // not TLS, a certificate the client or we refused, a timeout: the connection ends
            beast::error_code ignored;
            beast::get_lowest_layer(*stream).socket().close(ignored);
            return;
        }
        beast::get_lowest_layer(*stream).expires_never();
        std::make_shared<Session<TlsStream>>(std::move(*stream), opts, handler, std::move(*s))->run();
    });
}

}  // namespace peregrine::server
