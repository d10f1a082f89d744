// The OpenAI-compatible API on top of the Engine: routes, authentication, request parsing and
// tokenization (on the I/O thread that received the request), submission, and the answer
// (one JSON body, or server-sent events) built from the engine's outputs as the stream pump
// delivers them. A client that disconnects aborts its requests.
//
//   POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize
//   GET  /v1/models, /v1/models/{id}, /health (503 until set_model, and while draining), /metrics
//   OPTIONS (CORS preflight from an allowed origin)
//   GET  /v1/ws: a WebSocket; each text message {"id", "type": "completion" | "chat", "request"}
//        starts a streamed request, answered by {"id", "type": "chunk", "data": <SSE chunk>} ...
//        {"id", "type": "done"} or {"id", "type": "error", "error", "status"}; {"type": "cancel",
//        "id"} aborts one (finish reason "abort"); closing the socket aborts them all.
//
// Around the routes: CORS headers, API keys, per-key rate limits (429 with Retry-After), JSON
// access logs, and draining (begin_drain: new API requests get 503, in-flight ones finish).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "peregrine/engine.h"
#include "server/admission.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/middleware.h"
#include "server/openai_protocol.h"
#include "server/stream_pump.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::server {

struct WsConnection;  // one /v1/ws connection (openai_server.cc)

// Inside a catch block: what a client is told about the exception being handled (every
// transport): ApiError as it is, a template's raise_exception and other Error as 400, anything
// else (a bug) as 500, logged.
ApiError current_api_error();

// A loaded model ready to serve.
struct ServedModel {
    std::shared_ptr<void> owner;  // what the engine's executor points into; outlives the engine
    std::shared_ptr<const Tokenizer> tokenizer;
    std::shared_ptr<const ChatTemplate> chat_template;  // null when the model has none
    std::string chat_template_error;                    // why it is null
    std::unique_ptr<Engine> engine;
    int max_model_len = 0;
    int vocab_size = 0;
    size_t max_token_bytes = 0;  // the longest token's text (set_model): bytes per token at most
    std::string path;

    ~ServedModel();  // the engine first, then what it points into
};

struct OpenAiServerOptions {
    std::vector<std::string> model_names;      // the first is the one reported; requests may name any
    std::vector<std::string> api_keys;         // empty: no authentication
    std::vector<std::string> allowed_origins;  // CORS; "*" for any, empty: no CORS headers
    RateLimitOptions rate_limits;              // per API key, or per client address without keys
    bool access_log = false;                   // one JSON line per request on stderr
    AdmissionLimits limits;                    // per request and in flight, on every transport
};

// A completion request checked and admitted, ready for the engine.
struct PreparedCompletion {
    CompletionParams params;
    std::vector<std::vector<int32_t>> prompts;  // token ids, one list per prompt
    std::vector<std::string> echo_texts;        // completions: each prompt's text, for echo
    Ticket ticket;                              // its share of the in-flight limits, until it ends
};

class OpenAiServer {
  public:
    explicit OpenAiServer(OpenAiServerOptions options);
    ~OpenAiServer();

    // The model is loaded: start answering (until then everything but /health is 503).
    void set_model(std::unique_ptr<ServedModel> model);
    // Called on a connection's strand for each request.
    void handle(const HttpRequest& req, std::shared_ptr<Exchange> ex);
    // Aborts what is running, stops the engine and the pump, drops every pending exchange.
    void shutdown();

    // Graceful shutdown: /health answers 503 "draining" and new API requests 503; running ones go on.
    void begin_drain() { draining_.store(true, std::memory_order_release); }
    // Completion requests still being answered (every transport).
    int64_t in_flight() const { return admission_.requests_in_flight(); }
    // Ends every running request now (finish reason "abort"); their answers still go out.
    void abort_all();

    const std::string& model_name() const { return options_.model_names.front(); }

    struct Counters {
        std::atomic<uint64_t> requests_served{0};   // completions answered in full
        std::atomic<uint64_t> requests_aborted{0};  // ended by a client that went away or cancelled
    };

    // For other front ends on the same model and engine (the gRPC API, grpc_server.h).
    const ServedModel* model() const { return ready_.load(std::memory_order_acquire) ? model_.get() : nullptr; }
    bool draining() const { return draining_.load(std::memory_order_acquire); }
    const OpenAiServerOptions& options() const { return options_; }
    Counters& counters() { return counters_; }
    ServerMetrics& metrics() { return metrics_; }
    StreamPump& pump() { return pump_; }
    // The one admission path of every transport. check_caller: 401 / 503 (loading, draining).
    void check_caller(const Caller& caller) const;
    // Requests that hold nothing in flight (tokenize, models): the caller's request rate.
    void charge(const Caller& caller) { admission_.charge(caller); }
    // A completion or chat body: parsed and validated, the model name checked, the prompts
    // tokenized (chat: rendered), the context and per-request limits checked, room in flight
    // reserved and the caller's rate limits charged. Throws ApiError.
    PreparedCompletion prepare_completion(const Caller& caller, const Json& body, Endpoint endpoint) const;
    // Engine::submit, its refusals as ApiError (400 naming the field; 503 when shutting down).
    std::shared_ptr<RequestStream> submit(Request request, bool chat) const;
    // Throws ApiError(404) for a name this server does not serve (empty: the default).
    void check_model(const std::string& name) const;
    // Chat messages through the model's template into prompt ids; throws ApiError(400).
    std::vector<int32_t> render_chat(const CompletionParams& p) const;

  private:
    void handle_completion(const HttpRequest& req, std::shared_ptr<Exchange> ex, bool chat);
    // A prompt's text into ids; 400 without tokenizing when it is surely over the context.
    std::vector<int32_t> encode_prompt(const std::string& text, bool add_special, const char* param) const;
    void start_completion(const Caller& caller, const Json& body, bool chat, std::shared_ptr<Exchange> ex);
    void handle_websocket(const HttpRequest& req, Exchange& ex);
    void on_ws_message(const std::shared_ptr<WsConnection>& conn, const std::string& text);
    void route(const HttpRequest& req, const std::shared_ptr<Exchange>& ex);
    void handle_health(Exchange& ex);
    void handle_metrics(Exchange& ex);
    void handle_models(Exchange& ex, const std::string& id);
    void handle_tokenize(const HttpRequest& req, Exchange& ex);
    void handle_detokenize(const HttpRequest& req, Exchange& ex);

    OpenAiServerOptions options_;
    std::atomic<bool> ready_{false};
    std::atomic<bool> draining_{false};
    CorsPolicy cors_;
    mutable Admission admission_;
    ServerMetrics metrics_;
    std::unique_ptr<ServedModel> model_;
    jinja::Context template_functions_;  // strftime_now
    StreamPump pump_;
    Counters counters_;
    const std::chrono::steady_clock::time_point started_;
    const int64_t created_unix_;
};

}  // namespace peregrine::server
