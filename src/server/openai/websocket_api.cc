#include "server/openai/websocket_api.h"

#include <chrono>
#include <unordered_map>

#include "core/error.h"
#include "server/api_error.h"
#include "server/middleware.h"

namespace peregrine::server {

class WsRequestExchange;

// One /v1/ws connection: the requests it has running, by client id. Strand only.
struct WsConnection {
    std::shared_ptr<WebSocket> ws;
    std::string authorization;  // of the handshake: what each message's request is checked as
    std::string remote;
    std::unordered_map<std::string, std::shared_ptr<WsRequestExchange>> running;

    void send(const Json& j) { ws->send(dump(j)); }
    void send_error(const Json& id, const ApiError& e) {
        Json j;
        j["id"] = id;
        j["type"] = "error";
        j["error"] = e.body()["error"];
        j["status"] = e.status();
        send(j);
    }
};

// The exchange of one request multiplexed on a WebSocket: the completion's SSE events become
// messages tagged with the client's id, its error response an error message. With the access
// log, one line per request when it ends (method "WS", path "/v1/ws <type>", status 499 when
// the connection went away first), as HTTP requests and gRPC calls get.
class WsRequestExchange final : public Exchange {
  public:
    WsRequestExchange(std::shared_ptr<WsConnection> conn, std::string id, std::string type, bool access_log)
        : conn_(std::move(conn)),
          id_(std::move(id)),
          id_json_(dump(Json(id_))),
          type_(std::move(type)),
          access_log_(access_log),
          start_(std::chrono::steady_clock::now()) {}

    void post(std::function<void()> fn) override { conn_->ws->post(std::move(fn)); }

    void respond(int status, std::string body, std::string, const HeaderList&) override {
        if (ended_) return;
        Json j;
        j["id"] = id_;
        j["type"] = "error";
        Json parsed = Json::parse(body, nullptr, false);
        j["error"] = parsed.is_object() && parsed.contains("error") ? parsed["error"] : Json{{"message", body}};
        j["status"] = status;
        conn_->send(j);
        status_ = status;
        end();
    }
    void start_events(const HeaderList&) override {}
    void send_event(std::string_view data) override {
        if (ended_) return;
        if (data == "[DONE]") {
            conn_->ws->send(str_cat(R"({"id":)", id_json_, R"(,"type":"done"})"));
            return;
        }
        conn_->ws->send(str_cat(R"({"id":)", id_json_, R"(,"type":"chunk","data":)", data, "}"));
        if (access_log_ && data.find(R"("usage":{)") != std::string_view::npos) {
            const Json chunk = Json::parse(data, nullptr, false);
            if (chunk.is_object() && chunk.contains("usage") && chunk["usage"].is_object()) {
                prompt_tokens_ = chunk["usage"].value("prompt_tokens", -1);
                completion_tokens_ = chunk["usage"].value("completion_tokens", -1);
            }
        }
    }
    void end_events() override { end(); }
    void on_client_gone(std::function<void()> fn) override {
        if (gone_) return fn();
        on_gone_ = std::move(fn);
    }
    bool client_gone() const override { return gone_; }
    void on_cancel(std::function<void()> fn) override { on_cancel_ = std::move(fn); }
    void accept_websocket(WebSocketSetup) override {}

    // The request failed before its answer started.
    void fail(const ApiError& e) {
        if (ended_) return;
        conn_->send_error(Json(id_), e);
        status_ = e.status();
        end();
    }
    void cancel() {
        if (on_cancel_) on_cancel_();
    }
    // The connection closed: abort.
    void connection_gone() {
        if (gone_) return;
        gone_ = true;
        if (!ended_) {
            status_ = 499;
            log();
        }
        ended_ = true;
        auto fn = std::move(on_gone_);
        on_gone_ = nullptr;
        on_cancel_ = nullptr;
        if (fn) fn();
    }

  private:
    void end() {
        if (ended_) return;
        ended_ = true;
        log();
        on_gone_ = nullptr;
        on_cancel_ = nullptr;
        conn_->running.erase(id_);  // may drop the last reference but one: `this` is held by the caller
    }
    void log() const {
        if (!access_log_) return;
        AccessRecord r{id_, conn_->remote, "WS", "/v1/ws " + type_, status_, 0, prompt_tokens_, completion_tokens_};
        r.duration_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
        write_access_log(r);
    }

    std::shared_ptr<WsConnection> conn_;
    const std::string id_;
    const std::string id_json_;
    const std::string type_;
    const bool access_log_;
    const std::chrono::steady_clock::time_point start_;
    int status_ = 200;
    int prompt_tokens_ = -1, completion_tokens_ = -1;
    std::function<void()> on_gone_, on_cancel_;
    bool ended_ = false;
    bool gone_ = false;
};

namespace {

// %XX escapes and '+' (a query's space) decoded; a malformed escape is kept as it is.
std::string url_decode(std::string_view s) {
    auto hex = [](char c) {
        return c >= '0' && c <= '9'   ? c - '0'
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                      : -1;
    };
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
            out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
            i += 2;
        } else {
            out += s[i] == '+' ? ' ' : s[i];
        }
    }
    return out;
}

}  // namespace

// Browsers cannot set Authorization on a WebSocket: the key may also come as the subprotocol
// `openai-insecure-api-key.KEY` (OpenAI's Realtime convention) or the query `api_key=KEY`
// (URL-escaped). Returned as the header it stands for ("Bearer KEY"), the header winning.
std::string websocket_authorization(const HttpRequest& req) {
    if (const std::string_view h = req.header("authorization"); !h.empty()) return std::string(h);
    constexpr std::string_view kCarrier = "openai-insecure-api-key.";
    const std::string_view offered = req.header("sec-websocket-protocol");
    for (size_t at = offered.find(kCarrier); at != std::string_view::npos; at = offered.find(kCarrier, at + 1)) {
        if (at > 0 && offered[at - 1] != ' ' && offered[at - 1] != ',') continue;
        const std::string_view rest = offered.substr(at + kCarrier.size());
        return "Bearer " + std::string(rest.substr(0, rest.find_first_of(", ")));
    }
    for (std::string_view q = req.query; !q.empty();) {
        const size_t amp = q.find('&');
        const std::string_view pair = q.substr(0, amp);
        q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
        if (pair.starts_with("api_key=")) return "Bearer " + url_decode(pair.substr(8));
    }
    return {};
}

void WebSocketApi::accept(const ApiCall& call) {
    const HttpRequest& req = *call.http;
    if (!req.websocket_upgrade)
        throw ApiError(426, "/v1/ws is a WebSocket endpoint; send a WebSocket upgrade request", "", "upgrade_required");
    // Checked here so that a bad handshake gets a JSON error like any other (Beast's is plain text).
    if (req.header("sec-websocket-version") != "13")
        throw ApiError(426, "this server speaks WebSocket version 13 (Sec-WebSocket-Version: 13)", "",
                       "upgrade_required");
    const std::string_view key = req.header("sec-websocket-key");
    if (key.size() != 24 || key.substr(22) != "==")
        throw ApiError(400, "the WebSocket handshake needs a Sec-WebSocket-Key (16 bytes, base64)", "",
                       "bad_websocket_handshake");
    // The dispatcher checked the upgrade with the key websocket_authorization found: keep it.
    call.ex->accept_websocket([this, authorization = std::string(call.caller.authorization),
                               remote = req.remote](std::shared_ptr<WebSocket> ws) {
        auto conn = std::make_shared<WsConnection>();
        conn->ws = std::move(ws);
        conn->authorization = authorization;
        conn->remote = remote;
        WebSocketCallbacks cb;
        cb.on_message = [this, conn](std::string text) { on_message(conn, text); };
        cb.on_close = [conn] {
            auto running = std::move(conn->running);
            conn->running.clear();
            for (auto& [id, rex] : running) rex->connection_gone();
        };
        return cb;
    });
}

void WebSocketApi::on_message(const std::shared_ptr<WsConnection>& conn, const std::string& text) {
    Json id = nullptr;
    try {
        const Json msg = parse_json_object(text, "message");
        if (auto it = msg.find("id"); it != msg.end()) id = *it;
        if (!id.is_string() || id.get_ref<const std::string&>().empty())
            bad_param("id", "'id' (a non-empty string naming the request) is required");
        const std::string key = id.get<std::string>();
        auto type_it = msg.find("type");
        const std::string type = type_it != msg.end() && type_it->is_string() ? type_it->get<std::string>() : "";
        if (type == "cancel") {
            if (auto it = conn->running.find(key); it != conn->running.end()) it->second->cancel();
            return;  // an id that has already ended: nothing to do
        }
        const Route* route = routes_.find_ws(type);
        if (!route) bad_param("type", "'type' must be \"completion\", \"chat\" or \"cancel\"");
        if (conn->running.count(key)) bad_param("id", "a request with id '", key, "' is already running");
        auto body = msg.find("request");
        if (body == msg.end() || !body->is_object()) bad_param("request", "'request' (a JSON object) is required");
        ApiCall call;
        call.caller = Caller{"ws", conn->authorization, conn->remote};
        service_.check_caller(call.caller);
        if (route->access == Access::Api) service_.charge(call.caller);
        call.body = *body;
        call.body["stream"] = true;  // answered as events, whatever the request says
        auto ex = std::make_shared<WsRequestExchange>(conn, key, type, service_.options().access_log);
        call.ex = ex;
        conn->running[key] = ex;
        try {
            route->handle(call);
        } catch (...) {
            ex->fail(current_api_error());
        }
    } catch (...) {
        conn->send_error(id, current_api_error());
    }
}

}  // namespace peregrine::server
