#include "server/middleware.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

namespace peregrine::server {

namespace {

std::string utc_now_iso8601() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[40];
    const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    std::snprintf(buf + n, sizeof(buf) - n, ".%03dZ", static_cast<int>(ms));
    return buf;
}

}  // namespace

void write_access_log(const AccessRecord& r) {
    nlohmann::ordered_json j;
    j["time"] = utc_now_iso8601();
    j["request_id"] = r.request_id;
    j["remote"] = r.remote;
    j["method"] = r.method;
    j["path"] = r.path;
    j["status"] = r.status;
    j["duration_ms"] = std::round(r.duration_ms * 1000) / 1000;
    j["prompt_tokens"] = r.prompt_tokens >= 0 ? nlohmann::ordered_json(r.prompt_tokens) : nullptr;
    j["completion_tokens"] = r.completion_tokens >= 0 ? nlohmann::ordered_json(r.completion_tokens) : nullptr;
    const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
}

bool CorsPolicy::allowed(std::string_view origin) const {
    if (origin.empty()) return false;
    for (const std::string& o : origins_)
        if (o == "*" || o == origin) return true;
    return false;
}

HeaderList CorsPolicy::response_headers(const HttpRequest& req) const {
    HeaderList h;
    const std::string_view origin = req.header("origin");
    if (!allowed(origin)) return h;
    h.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    h.emplace_back("Vary", "Origin");
    h.emplace_back("Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
    return h;
}

bool CorsPolicy::is_allowed_preflight(const HttpRequest& req) const {
    return req.method == "OPTIONS" && allowed(req.header("origin")) &&
           !req.header("access-control-request-method").empty();
}

HeaderList CorsPolicy::preflight_headers(const HttpRequest& req) const {
    HeaderList h;
    h.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    std::string headers = "Authorization, Content-Type, X-Request-Id";
    const std::string_view asked = req.header("access-control-request-headers");
    // Echo what the browser asks for (the openai SDK sends its own x-stainless-* headers).
    if (!asked.empty() && asked.find_first_of("\r\n") == std::string_view::npos) {
        headers += ", ";
        headers += asked;
    }
    h.emplace_back("Access-Control-Allow-Headers", headers);
    h.emplace_back("Access-Control-Max-Age", "600");
    return h;
}

TrackedExchange::TrackedExchange(std::shared_ptr<Exchange> inner, const HttpRequest& req, HeaderList extra,
                                 bool access_log)
    : inner_(std::move(inner)),
      extra_(std::move(extra)),
      access_log_(access_log),
      request_id_(req.request_id),
      remote_(req.remote),
      method_(req.method),
      path_(req.path),
      start_(std::chrono::steady_clock::now()) {}

HeaderList TrackedExchange::merged(const HeaderList& extra) const {
    if (extra_.empty()) return extra;
    HeaderList h = extra;
    h.insert(h.end(), extra_.begin(), extra_.end());
    return h;
}

void TrackedExchange::respond(int status, std::string body, std::string content_type, const HeaderList& extra) {
    inner_->respond(status, std::move(body), std::move(content_type), merged(extra));
    finish(status);
}

void TrackedExchange::start_events(const HeaderList& extra) {
    status_ = 200;
    inner_->start_events(merged(extra));
}

void TrackedExchange::end_events() {
    inner_->end_events();
    finish(200);
}

void TrackedExchange::on_client_gone(std::function<void()> fn) {
    auto self = shared_from_this();
    inner_->on_client_gone([self, fn = std::move(fn)] {
        self->finish(499);
        fn();
    });
}

void TrackedExchange::accept_websocket(WebSocketSetup setup) {
    inner_->accept_websocket(std::move(setup));
    finish(101);
}

void TrackedExchange::note_usage(int prompt_tokens, int completion_tokens) {
    prompt_tokens_ = prompt_tokens;
    completion_tokens_ = completion_tokens;
}

void TrackedExchange::finish(int status) {
    if (finished_) return;
    finished_ = true;
    status_ = status;
    if (!access_log_) return;
    AccessRecord r{request_id_, remote_, method_, path_, status_, 0, prompt_tokens_, completion_tokens_};
    r.duration_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    write_access_log(r);
}

}  // namespace peregrine::server
