// What wraps every exchange before routing: CORS (configured origins, preflight) and a per-request
// record (status, duration, tokens) written as one JSON access-log line on stderr.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/http/exchange.h"

namespace peregrine::server {

// Origins a browser may call from: exact matches ("https://app.example"), or "*" for any.
class CorsPolicy {
  public:
    explicit CorsPolicy(std::vector<std::string> allowed_origins) : origins_(std::move(allowed_origins)) {}
    bool enabled() const { return !origins_.empty(); }
    // Headers every response to this request carries (none unless its Origin is allowed).
    HeaderList response_headers(const HttpRequest& req) const;
    // A preflight (OPTIONS with Origin and Access-Control-Request-Method) from an allowed origin.
    bool is_allowed_preflight(const HttpRequest& req) const;
    // The preflight answer's headers (on top of response_headers).
    HeaderList preflight_headers(const HttpRequest& req) const;

  private:
    bool allowed(std::string_view origin) const;
    std::vector<std::string> origins_;
};

// One access-log line: {"time", "request_id", "remote", "method", "path", "status",
// "duration_ms", "prompt_tokens", "completion_tokens"} on stderr (token counts null when < 0).
// `status` is HTTP's, or for gRPC the status code's number (0 OK, 1 CANCELLED, ...).
struct AccessRecord {
    std::string request_id, remote, method, path;
    int status = 0;
    double duration_ms = 0;
    int prompt_tokens = -1, completion_tokens = -1;
};
void write_access_log(const AccessRecord& r);

// Forwards to the connection's exchange, adding `extra` headers to every response, and (when
// `access_log`) writes one JSON line on stderr when the exchange ends:
//   {"time", "request_id", "remote", "method", "path", "status", "duration_ms", "prompt_tokens",
//    "completion_tokens"}    (status 499: the client went away first)
class TrackedExchange final : public Exchange, public std::enable_shared_from_this<TrackedExchange> {
  public:
    TrackedExchange(std::shared_ptr<Exchange> inner, const HttpRequest& req, HeaderList extra, bool access_log);

    void post(std::function<void()> fn) override { inner_->post(std::move(fn)); }
    void respond(int status, std::string body, std::string content_type = "application/json",
                 const HeaderList& extra = {}) override;
    void start_events(const HeaderList& extra = {}) override;
    void send_event(std::string_view data) override { inner_->send_event(data); }
    void send_framed_events(std::string_view framed) override { inner_->send_framed_events(framed); }
    boost::asio::any_io_executor executor() const override { return inner_->executor(); }
    void end_events() override;
    void on_client_gone(std::function<void()> fn) override;
    bool client_gone() const override { return inner_->client_gone(); }
    void note_usage(int prompt_tokens, int completion_tokens) override;
    void on_cancel(std::function<void()> fn) override { inner_->on_cancel(std::move(fn)); }
    void accept_websocket(WebSocketSetup setup) override;

  private:
    HeaderList merged(const HeaderList& extra) const;
    void finish(int status);

    std::shared_ptr<Exchange> inner_;
    HeaderList extra_;
    bool access_log_;
    std::string request_id_, remote_, method_, path_;
    std::chrono::steady_clock::time_point start_;
    int status_ = 0;
    int prompt_tokens_ = -1, completion_tokens_ = -1;
    bool finished_ = false;
};

}  // namespace peregrine::server
