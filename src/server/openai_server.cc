#include "server/openai_server.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include "server/api_error.h"
#include "template/jinja.h"

namespace peregrine::server {

namespace {

std::string dump(const Json& j) {
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void send_error(Exchange& ex, const ApiError& e, const HeaderList& extra = {}) {
    ex.respond(e.status(), dump(e.body()), "application/json", extra);
}

void send_json(Exchange& ex, const Json& j, int status = 200) {
    ex.respond(status, dump(j));
}

// Nesting is bounded: deeper values would recurse through every later conversion.
constexpr int kMaxJsonDepth = 64;

Json parse_object(const std::string& text, const char* what) {
    if (text.empty()) throw ApiError(400, str_cat("the ", what, " is empty; expected a JSON object"));
    auto depth_limit = [](int depth, Json::parse_event_t, Json&) {
        if (depth > kMaxJsonDepth)
            throw ApiError(400, str_cat("the request JSON nests deeper than ", kMaxJsonDepth, " levels"));
        return true;
    };
    try {
        Json j = Json::parse(text, depth_limit);
        if (!j.is_object()) throw ApiError(400, str_cat("the ", what, " must be a JSON object"));
        return j;
    } catch (const Json::parse_error& e) {
        throw ApiError(400, str_cat("the ", what, " is not valid JSON: ", e.what()), "", "invalid_json");
    } catch (const Json::exception& e) {
        // out_of_range: a number no double holds (1e309), wherever it is in the body.
        throw ApiError(400, str_cat("the ", what, " cannot be read: ", e.what()), "", "invalid_json");
    }
}

// A body is read as JSON when it says so (application/json, application/*+json, any
// parameters) or says nothing; any other media type is refused.
void check_json_content_type(const HttpRequest& req) {
    std::string_view type = req.header("content-type");
    type = type.substr(0, type.find(';'));
    while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
    while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
    if (type.empty()) return;
    std::string t(type);
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool json = t == "application/json" ||
                      (t.rfind("application/", 0) == 0 && t.size() > 17 && t.compare(t.size() - 5, 5, "+json") == 0);
    if (!json)
        throw ApiError(415, str_cat("Content-Type '", type, "' is not supported; send application/json"), "",
                       "unsupported_media_type");
}

}  // namespace

ApiError current_api_error() {
    try {
        throw;
    } catch (const ApiError& e) {
        return e;
    } catch (const jinja::RaisedError& e) {
        return ApiError(400, e.what(), "messages", "chat_template_error");
    } catch (const Error& e) {
        return ApiError(400, e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "server: request failed: %s\n", e.what());
        return ApiError(500, "internal error while handling the request", "", "internal_error");
    }
}

namespace {

Json parse_body(const HttpRequest& req) {
    return parse_object(req.body, "request body");
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

uint64_t rss_bytes() {
    std::ifstream f("/proc/self/statm");
    uint64_t size = 0, resident = 0;
    if (!(f >> size >> resident)) return 0;
    return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// The engine refused a request (Engine::submit): a 400 naming the field when the message does.
ApiError engine_error(const Error& e, bool chat) {
    const std::string msg = e.what();
    auto starts = [&](const char* p) { return msg.rfind(p, 0) == 0; };
    std::string param;
    if (starts("the prompt") || starts("prompt token"))
        param = chat ? "messages" : "prompt";
    else if (starts("logit_bias"))
        param = "logit_bias";
    else if (starts("stop strings"))
        param = "stop";
    else {
        for (const char* p : {"n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
                              "min_tokens", "logprobs"})
            if (starts(p) && msg.size() > std::strlen(p) && msg[std::strlen(p)] == ' ') param = p;
    }
    if (starts("the engine is shutting down")) return ApiError(503, msg, "", "shutting_down");
    return ApiError(400, msg, param);
}

Json stop_reason_json(const std::string& s, const SamplingParams& sp) {
    if (s.empty()) return nullptr;
    for (const std::string& stop : sp.stop)
        if (stop == s) return s;
    try {
        size_t used = 0;
        const long v = std::stol(s, &used);
        if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    return s;
}

// One /v1/completions or /v1/chat/completions request, from submission to its last byte. Lives
// on the connection's strand (on_outputs arrives there through Exchange::post).
class CompletionJob : public std::enable_shared_from_this<CompletionJob> {
  public:
    CompletionJob(const ServedModel& model, OpenAiServer::Counters& counters, ServerMetrics& metrics,
                  PreparedCompletion prepared, std::shared_ptr<Exchange> ex, std::string model_name)
        : prompts(std::move(prepared.prompts)),
          echo_texts(std::move(prepared.echo_texts)),
          model_(model),
          counters_(counters),
          metrics_(metrics),
          p_(std::move(prepared.params)),
          ticket_(std::move(prepared.ticket)),
          ex_(std::move(ex)),
          model_name_(std::move(model_name)),
          chat_(p_.endpoint == Endpoint::ChatCompletions),
          id_(str_cat(chat_ ? "chatcmpl-" : "cmpl-", random_hex_id())),
          created_(unix_now()) {}

    // Prompts (token ids) and, for echo, their text.
    const std::vector<std::vector<int32_t>> prompts;
    const std::vector<std::string> echo_texts;

    // Submits every prompt; throws ApiError (nothing left running) when the engine refuses one.
    void submit(StreamPump& pump) {
        const int n = p_.sampling.n;
        choices_.resize(prompts.size() * n);
        std::vector<std::shared_ptr<RequestStream>> streams;
        const bool generate = p_.sampling.max_tokens > 0;  // max_tokens 0 with echo: the prompt only
        for (size_t i = 0; generate && i < prompts.size(); ++i) {
            Request r;
            r.id = prompts.size() == 1 ? id_ : str_cat(id_, "-", i);
            r.prompt_ids = prompts[i];
            r.sampling = p_.sampling;
            r.priority = p_.priority;
            r.cache_salt = p_.cache_salt;
            r.group = id_;  // the prompts of one call share one fair share of the running slots
            try {
                streams.push_back(model_.engine->submit(std::move(r)));
            } catch (const Error& e) {
                for (const auto& s : streams) model_.engine->abort(s->id());
                throw engine_error(e, chat_);
            }
            prompt_of_[streams.back()->id()] = static_cast<int>(i);
        }
        if (!generate) {
            for (size_t i = 0; i < prompts.size(); ++i) {
                usage_.prompt_tokens += static_cast<int>(prompts[i].size());
                for (int c = 0; c < n; ++c) choices_[i * n + c].finish = FinishReason::Length;
            }
        }
        engine_ids_.reserve(streams.size());
        for (const auto& s : streams) engine_ids_.push_back(s->id());

        if (p_.stream) {
            ex_->start_events();
            for (size_t ci = 0; ci < choices_.size(); ++ci) begin_choice_events(static_cast<int>(ci));
        }
        auto self = shared_from_this();
        ex_->on_client_gone([self] { self->client_gone(); });
        ex_->on_cancel([self] { self->cancel(); });
        pump.add(std::move(streams), [self](std::vector<RequestOutput>&& outs, bool done) {
            auto batch = std::make_shared<std::vector<RequestOutput>>(std::move(outs));
            self->ex_->post([self, batch, done] {
                try {
                    self->on_outputs(*batch, done);
                } catch (const std::exception& e) {
                    self->fail(e.what());
                }
            });
        });
    }

  private:
    struct Choice {
        std::string text;
        std::vector<TokenLogprob> logprobs;
        FinishReason finish = FinishReason::None;
        std::string stop_reason;
        int offset = 0;  // legacy logprobs: bytes of text so far
    };

    int prompt_index(const std::string& request_id) const {
        auto it = prompt_of_.find(request_id);
        return it == prompt_of_.end() ? 0 : it->second;
    }

    // A bug surfaced while answering: end the exchange cleanly rather than leave the client waiting.
    void fail(const char* what) {
        std::fprintf(stderr, "server: %s failed: %s\n", id_.c_str(), what);
        if (failed_) return;
        failed_ = true;
        for (const std::string& id : engine_ids_) model_.engine->abort(id);
        const ApiError e(500, "internal error while answering the request", "", "internal_error");
        if (p_.stream) {
            ex_->send_event(dump(e.body()));
            ex_->end_events();
        } else {
            send_error(*ex_, e);
        }
    }

    void client_gone() {
        if (gone_) return;
        gone_ = true;
        for (const std::string& id : engine_ids_) model_.engine->abort(id);
    }

    // The client asked to stop but still listens: the answer ends with finish reason "abort".
    void cancel() {
        cancelled_ = true;
        for (const std::string& id : engine_ids_) model_.engine->abort(id);
    }

    void on_outputs(std::vector<RequestOutput>& outs, bool done) {
        if (failed_) {
            if (done) ticket_.release();
            return;
        }
        for (RequestOutput& out : outs) {
            const int pi = prompt_index(out.request_id);
            const int ci = pi * p_.sampling.n + out.index;
            if (ci < 0 || ci >= static_cast<int>(choices_.size())) continue;
            if (out.usage && out.timing) metrics_.observe_request(out.finish, *out.usage, *out.timing);
            if (out.usage) {
                usage_.prompt_tokens += out.usage->prompt_tokens;
                usage_.completion_tokens += out.usage->completion_tokens;
                usage_.cached_tokens += out.usage->cached_tokens;
            }
            Choice& c = choices_[ci];
            if (out.finish != FinishReason::None) {
                c.finish = out.finish;
                c.stop_reason = out.stop_reason;
            }
            if (p_.stream && !gone_) {
                send_delta(ci, out);
            } else {
                c.text += out.text;
                if (p_.sampling.logprobs >= 0)
                    c.logprobs.insert(c.logprobs.end(), std::make_move_iterator(out.logprobs.begin()),
                                      std::make_move_iterator(out.logprobs.end()));
            }
        }
        if (!done) return;
        ticket_.release();
        ex_->note_usage(usage_.prompt_tokens, usage_.completion_tokens);
        if (gone_ || ex_->client_gone()) {
            ++counters_.requests_aborted;
            return;
        }
        ++(cancelled_ ? counters_.requests_aborted : counters_.requests_served);
        if (p_.stream)
            finish_events();
        else
            send_whole();
    }

    Json chunk_base() const {
        Json j;
        j["id"] = id_;
        j["object"] = chat_ ? "chat.completion.chunk" : "text_completion";
        j["created"] = created_;
        j["model"] = model_name_;
        return j;
    }

    Json finish_json(const Choice& c) const {
        return c.finish == FinishReason::None ? Json(nullptr) : Json(finish_reason_name(c.finish));
    }

    // The first events of a choice: the role (chat) or the echoed prompt (completions).
    void begin_choice_events(int ci) {
        Json chunk = chunk_base();
        Json choice;
        choice["index"] = ci;
        if (chat_) {
            choice["delta"] = {{"role", "assistant"}, {"content", ""}};
            choice["logprobs"] = nullptr;
            choice["finish_reason"] = nullptr;
        } else {
            if (!p_.echo && p_.sampling.max_tokens > 0) return;
            const int pi = ci / p_.sampling.n;
            Choice& c = choices_[ci];
            choice["text"] = p_.echo ? echo_texts[pi] : "";
            if (p_.sampling.logprobs >= 0) {
                choice["logprobs"] = completion_logprobs_json(
                    *model_.tokenizer, p_.echo ? prompts[pi] : std::vector<int32_t>{}, {}, &c.offset);
            } else {
                choice["logprobs"] = nullptr;
            }
            choice["finish_reason"] = finish_json(c);
        }
        chunk["choices"] = Json::array({choice});
        if (p_.include_usage) chunk["usage"] = nullptr;
        ex_->send_event(dump(chunk));
    }

    void send_delta(int ci, const RequestOutput& out) {
        Choice& c = choices_[ci];
        const bool has_logprobs = p_.sampling.logprobs >= 0 && !out.logprobs.empty();
        const bool finished = out.finish != FinishReason::None;
        if (chat_) {
            if (!out.text.empty() || has_logprobs) {
                Json chunk = chunk_base();
                Json choice;
                choice["index"] = ci;
                choice["delta"] = {{"content", out.text}};
                choice["logprobs"] =
                    has_logprobs ? Json{{"content",
                                         chat_logprobs_content(*model_.tokenizer, out.logprobs, p_.sampling.logprobs)}}
                                 : Json(nullptr);
                choice["finish_reason"] = nullptr;
                chunk["choices"] = Json::array({choice});
                if (p_.include_usage) chunk["usage"] = nullptr;
                ex_->send_event(dump(chunk));
            }
            if (finished) {
                Json chunk = chunk_base();
                Json choice;
                choice["index"] = ci;
                choice["delta"] = Json::object();
                choice["logprobs"] = nullptr;
                choice["finish_reason"] = finish_json(c);
                choice["stop_reason"] = stop_reason_json(c.stop_reason, p_.sampling);
                chunk["choices"] = Json::array({choice});
                if (p_.include_usage) chunk["usage"] = nullptr;
                ex_->send_event(dump(chunk));
            }
            return;
        }
        if (out.text.empty() && !has_logprobs && !finished) return;
        Json chunk = chunk_base();
        Json choice;
        choice["index"] = ci;
        choice["text"] = out.text;
        choice["logprobs"] =
            has_logprobs ? completion_logprobs_json(*model_.tokenizer, {}, out.logprobs, &c.offset) : Json(nullptr);
        choice["finish_reason"] = finished ? finish_json(c) : Json(nullptr);
        choice["stop_reason"] = finished ? stop_reason_json(c.stop_reason, p_.sampling) : Json(nullptr);
        chunk["choices"] = Json::array({choice});
        if (p_.include_usage) chunk["usage"] = nullptr;
        ex_->send_event(dump(chunk));
    }

    void finish_events() {
        if (p_.include_usage) {
            Json chunk = chunk_base();
            chunk["choices"] = Json::array();
            chunk["usage"] = usage_json(usage_);
            ex_->send_event(dump(chunk));
        }
        ex_->send_event("[DONE]");
        ex_->end_events();
    }

    void send_whole() {
        Json j;
        j["id"] = id_;
        j["object"] = chat_ ? "chat.completion" : "text_completion";
        j["created"] = created_;
        j["model"] = model_name_;
        Json choices = Json::array();
        for (size_t ci = 0; ci < choices_.size(); ++ci) {
            Choice& c = choices_[ci];
            const int pi = static_cast<int>(ci) / p_.sampling.n;
            Json choice;
            choice["index"] = ci;
            if (chat_) {
                choice["message"] = {{"role", "assistant"}, {"content", c.text}};
                choice["logprobs"] =
                    p_.sampling.logprobs >= 0
                        ? Json{{"content", chat_logprobs_content(*model_.tokenizer, c.logprobs, p_.sampling.logprobs)}}
                        : Json(nullptr);
            } else {
                choice["text"] = p_.echo ? echo_texts[pi] + c.text : c.text;
                if (p_.sampling.logprobs >= 0) {
                    choice["logprobs"] = completion_logprobs_json(
                        *model_.tokenizer, p_.echo ? prompts[pi] : std::vector<int32_t>{}, c.logprobs, &c.offset);
                } else {
                    choice["logprobs"] = nullptr;
                }
            }
            choice["finish_reason"] = finish_json(c);
            choice["stop_reason"] = stop_reason_json(c.stop_reason, p_.sampling);
            choices.push_back(std::move(choice));
        }
        j["choices"] = std::move(choices);
        j["usage"] = usage_json(usage_);
        send_json(*ex_, j);
    }

    const ServedModel& model_;
    OpenAiServer::Counters& counters_;
    ServerMetrics& metrics_;
    const CompletionParams p_;
    Ticket ticket_;
    std::shared_ptr<Exchange> ex_;
    const std::string model_name_;
    const bool chat_;
    const std::string id_;
    const int64_t created_;
    std::unordered_map<std::string, int> prompt_of_;
    std::vector<std::string> engine_ids_;
    std::vector<Choice> choices_;
    Usage usage_;
    bool gone_ = false;
    bool cancelled_ = false;
    bool failed_ = false;
};

Caller caller_of(const HttpRequest& req, std::string_view transport) {
    return Caller{transport, req.header("authorization"), req.remote};
}

}  // namespace

class WsRequestExchange;

// One /v1/ws connection: the requests it has running, by client id. Strand only.
struct WsConnection {
    std::shared_ptr<WebSocket> ws;
    HttpRequest base;  // the upgrade request (headers, remote): what each request is checked as
    std::unordered_map<std::string, std::shared_ptr<WsRequestExchange>> running;
    bool closed = false;

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
// messages tagged with the client's id, its error response an error message.
class WsRequestExchange final : public Exchange {
  public:
    WsRequestExchange(std::shared_ptr<WsConnection> conn, std::string id)
        : conn_(std::move(conn)), id_(std::move(id)), id_json_(dump(Json(id_))) {}

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
        end();
    }
    void start_events(const HeaderList&) override {}
    void send_event(std::string_view data) override {
        if (ended_) return;
        if (data == "[DONE]")
            conn_->ws->send(str_cat(R"({"id":)", id_json_, R"(,"type":"done"})"));
        else
            conn_->ws->send(str_cat(R"({"id":)", id_json_, R"(,"type":"chunk","data":)", data, "}"));
    }
    void end_events() override { end(); }
    void on_client_gone(std::function<void()> fn) override {
        if (gone_) return fn();
        on_gone_ = std::move(fn);
    }
    bool client_gone() const override { return gone_; }
    void on_cancel(std::function<void()> fn) override { on_cancel_ = std::move(fn); }
    void accept_websocket(WebSocketSetup) override {}

    void cancel() {
        if (on_cancel_) on_cancel_();
    }
    // The connection closed: abort.
    void connection_gone() {
        if (gone_) return;
        gone_ = true;
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
        on_gone_ = nullptr;
        on_cancel_ = nullptr;
        conn_->running.erase(id_);  // may drop the last reference but one: `this` is held by the caller
    }

    std::shared_ptr<WsConnection> conn_;
    const std::string id_;
    const std::string id_json_;
    std::function<void()> on_gone_, on_cancel_;
    bool ended_ = false;
    bool gone_ = false;
};

ServedModel::~ServedModel() {
    engine.reset();
    owner.reset();
}

OpenAiServer::OpenAiServer(OpenAiServerOptions options)
    : options_(std::move(options)),
      cors_(options_.allowed_origins),
      admission_(options_.limits, options_.rate_limits, options_.api_keys),
      started_(std::chrono::steady_clock::now()),
      created_unix_(unix_now()) {
    if (options_.model_names.empty()) options_.model_names.push_back("peregrine");
    define_strftime_now(template_functions_, local_time_now);
}

OpenAiServer::~OpenAiServer() {
    shutdown();
}

void OpenAiServer::set_model(std::unique_ptr<ServedModel> model) {
    model_ = std::move(model);
    if (model_->tokenizer)
        for (int32_t id = 0; id < model_->tokenizer->size(); ++id)
            model_->max_token_bytes = std::max(
                {model_->max_token_bytes, model_->tokenizer->token(id).size(), model_->tokenizer->piece(id).size()});
    ready_.store(true, std::memory_order_release);
}

void OpenAiServer::abort_all() {
    if (model_ && model_->engine) model_->engine->shutdown();
}

void OpenAiServer::shutdown() {
    if (model_ && model_->engine) model_->engine->shutdown();
    pump_.stop();
}

void OpenAiServer::check_caller(const Caller& caller) const {
    admission_.check_caller(caller, ready_.load(std::memory_order_acquire), draining_.load(std::memory_order_acquire));
}

std::shared_ptr<RequestStream> OpenAiServer::submit(Request request, bool chat) const {
    try {
        return model_->engine->submit(std::move(request));
    } catch (const Error& e) {
        throw engine_error(e, chat);
    }
}

void OpenAiServer::check_model(const std::string& name) const {
    if (name.empty()) return;
    for (const std::string& n : options_.model_names)
        if (n == name) return;
    // The name is the client's: echoed back cut short (a 100 KB name in a gRPC status wedged the
    // HTTP/2 connection: trailers have a size limit).
    const std::string shown = name.size() > 128 ? str_cat(name.substr(0, 128), "...") : name;
    throw ApiError(404, str_cat("The model '", shown, "' does not exist; this server serves '", model_name(), "'"),
                   "model", "model_not_found");
}

void OpenAiServer::handle(const HttpRequest& req, std::shared_ptr<Exchange> raw) {
    std::shared_ptr<Exchange> ex;
    if (cors_.enabled() || options_.access_log)
        ex = std::make_shared<TrackedExchange>(std::move(raw), req, cors_.response_headers(req), options_.access_log);
    else
        ex = std::move(raw);
    if (cors_.is_allowed_preflight(req)) return ex->respond(204, "", "text/plain", cors_.preflight_headers(req));
    route(req, ex);
}

void OpenAiServer::route(const HttpRequest& req, const std::shared_ptr<Exchange>& ex) {
    try {
        const std::string& path = req.path;
        // HEAD is GET without the body (the HTTP layer leaves it out).
        auto method_is = [&](const char* m) {
            if (req.method == m || (req.method == "HEAD" && std::strcmp(m, "GET") == 0)) return true;
            throw ApiError(405, str_cat("method ", req.method, " is not allowed on ", path, "; use ", m), "",
                           "method_not_allowed");
        };
        if (path == "/health") {
            method_is("GET");
            return handle_health(*ex);
        }
        if (path == "/metrics") {
            method_is("GET");
            return handle_metrics(*ex);
        }
        const bool known = path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/models" ||
                           path.rfind("/v1/models/", 0) == 0 || path == "/tokenize" || path == "/detokenize" ||
                           path == "/v1/ws";
        if (!known) throw ApiError(404, str_cat("no route for ", req.method, " ", path), "", "not_found");
        const Caller caller = caller_of(req, "http");
        check_caller(caller);
        if (path == "/v1/ws" && method_is("GET")) return handle_websocket(req, *ex);
        const bool completion = path == "/v1/completions" || path == "/v1/chat/completions";
        if (req.method == "POST") check_json_content_type(req);
        if (!completion) charge(caller);  // completions pay once their tokens are known
        if (path == "/v1/completions" && method_is("POST")) return handle_completion(req, ex, false);
        if (path == "/v1/chat/completions" && method_is("POST")) return handle_completion(req, ex, true);
        if (path == "/v1/models" && method_is("GET")) return handle_models(*ex, "");
        if (path.rfind("/v1/models/", 0) == 0 && method_is("GET"))
            return handle_models(*ex, path.substr(std::strlen("/v1/models/")));
        if (path == "/tokenize" && method_is("POST")) return handle_tokenize(req, *ex);
        if (path == "/detokenize" && method_is("POST")) return handle_detokenize(req, *ex);
    } catch (...) {
        const ApiError e = current_api_error();
        HeaderList extra;
        if (e.status() == 401) extra.emplace_back("WWW-Authenticate", "Bearer");
        if (e.retry_after_s() > 0) extra.emplace_back("Retry-After", std::to_string(e.retry_after_s()));
        if (e.status() == 426) extra.emplace_back("Sec-WebSocket-Version", "13");
        if (e.status() == 405)
            extra.emplace_back("Allow", req.path == "/health" || req.path == "/metrics" || req.path == "/v1/ws" ||
                                                req.path.rfind("/v1/models", 0) == 0
                                            ? "GET, HEAD"
                                            : "POST");
        send_error(*ex, e, extra);
    }
}

void OpenAiServer::handle_websocket(const HttpRequest& req, Exchange& ex) {
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
    auto base = std::make_shared<HttpRequest>(req);
    base->body.clear();
    ex.accept_websocket([this, base](std::shared_ptr<WebSocket> ws) {
        auto conn = std::make_shared<WsConnection>();
        conn->ws = std::move(ws);
        conn->base = std::move(*base);
        WebSocketCallbacks cb;
        cb.on_message = [this, conn](std::string text) { on_ws_message(conn, text); };
        cb.on_close = [conn] {
            conn->closed = true;
            auto running = std::move(conn->running);
            conn->running.clear();
            for (auto& [id, rex] : running) rex->connection_gone();
        };
        return cb;
    });
}

void OpenAiServer::on_ws_message(const std::shared_ptr<WsConnection>& conn, const std::string& text) {
    Json id = nullptr;
    try {
        const Json msg = parse_object(text, "message");
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
        if (type != "completion" && type != "chat")
            bad_param("type", "'type' must be \"completion\", \"chat\" or \"cancel\"");
        if (conn->running.count(key)) bad_param("id", "a request with id '", key, "' is already running");
        auto body = msg.find("request");
        if (body == msg.end() || !body->is_object()) bad_param("request", "'request' (a JSON object) is required");
        const Caller caller = caller_of(conn->base, "ws");
        check_caller(caller);
        Json request = *body;
        request["stream"] = true;
        auto ex = std::make_shared<WsRequestExchange>(conn, key);
        conn->running[key] = ex;
        try {
            start_completion(caller, request, type == "chat", ex);
        } catch (...) {
            const ApiError e = current_api_error();
            ex->respond(e.status(), dump(e.body()), "", {});
        }
    } catch (...) {
        conn->send_error(id, current_api_error());
    }
}

std::vector<int32_t> OpenAiServer::render_chat(const CompletionParams& p) const {
    const ServedModel& m = *model_;
    if (!m.chat_template)
        throw ApiError(400, str_cat("this model has no chat template (", m.chat_template_error, ")"), "messages",
                       "no_chat_template");
    ChatInputs in;
    in.messages = p.messages;
    in.add_generation_prompt = p.add_generation_prompt;
    in.extra = p.chat_template_kwargs;
    std::string prompt;
    try {
        prompt = m.chat_template->render(in, template_functions_);
    } catch (const jinja::RaisedError& e) {
        throw ApiError(400, e.what(), "messages", "chat_template_error");
    } catch (const Error& e) {
        throw ApiError(400, str_cat("the chat template failed on these messages: ", e.what()), "messages",
                       "chat_template_error");
    }
    if (p.continue_final_message) {
        // The prompt ends right after the final message's content: the model continues it.
        const Json& last = p.messages.back();
        const std::string content = last["content"].get<std::string>();
        const size_t at = content.empty() ? std::string::npos : prompt.rfind(content);
        if (at != std::string::npos) prompt.resize(at + content.size());
    }
    return encode_prompt(prompt, p.add_special_tokens, "messages");
}

std::vector<int32_t> OpenAiServer::encode_prompt(const std::string& text, bool add_special, const char* param) const {
    const ServedModel& m = *model_;
    // No token is longer than max_token_bytes, so a text this long holds more tokens than the
    // context: refused before tokenizing (a 30 MiB prompt took ~300 MB to tokenize and reject).
    const size_t at_least = text.size() / std::max<size_t>(1, m.max_token_bytes);
    if (m.max_token_bytes > 0 && at_least >= static_cast<size_t>(m.max_model_len))
        throw ApiError(400,
                       str_cat("This model's maximum context length is ", m.max_model_len, " tokens, but the prompt (",
                               text.size(), " bytes) has at least ", at_least, " tokens"),
                       param, "context_length_exceeded");
    return m.tokenizer->encode(text, add_special, /*parse_special=*/true);
}

PreparedCompletion OpenAiServer::prepare_completion(const Caller& caller, const Json& body, Endpoint endpoint) const {
    const ServedModel& m = *model_;
    const bool chat = endpoint == Endpoint::ChatCompletions;
    PreparedCompletion out;
    CompletionParams& p = out.params;
    p = parse_completion_params(body, endpoint);
    check_model(p.model);
    admission_.check_shape(p.sampling.n, p.prompts.size());
    if (chat) {
        out.prompts.push_back(render_chat(p));
    } else {
        for (const PromptInput& in : p.prompts) {
            if (in.is_text) {
                out.prompts.push_back(encode_prompt(in.text, p.add_special_tokens, "prompt"));
                out.echo_texts.push_back(in.text);
            } else {
                for (int32_t id : in.ids)
                    if (!m.tokenizer->valid_id(id))
                        bad_param("prompt", "prompt token id ", id, " is outside the vocabulary (0..", m.vocab_size - 1,
                                  ")");
                out.prompts.push_back(in.ids);
                out.echo_texts.push_back(p.echo ? m.tokenizer->decode(in.ids) : std::string());
            }
        }
    }
    const char* prompt_param = chat ? "messages" : "prompt";
    RequestCost cost;
    for (const auto& ids : out.prompts) {
        const int len = static_cast<int>(ids.size());
        if (len == 0) bad_param(prompt_param, "the prompt is empty");
        if (len >= m.max_model_len)
            throw ApiError(
                400,
                str_cat("This model's maximum context length is ", m.max_model_len, " tokens, but the prompt has ", len,
                        " tokens, which leaves no room for the completion"),
                prompt_param, "context_length_exceeded");
        if (p.max_tokens_given && static_cast<int64_t>(len) + p.sampling.max_tokens > m.max_model_len)
            throw ApiError(
                400,
                str_cat("This model's maximum context length is ", m.max_model_len, " tokens, but ", len,
                        " prompt tokens plus ", p.max_tokens_param, " ", p.sampling.max_tokens, " exceed it"),
                p.max_tokens_param, "context_length_exceeded");
        // Each prompt once (its choices share it), plus the most each choice may generate.
        cost.sequences += p.sampling.n;
        cost.tokens += len + std::min<int64_t>(p.sampling.max_tokens, m.max_model_len - len) * p.sampling.n;
    }
    out.ticket = admission_.admit(caller, cost);
    return out;
}

void OpenAiServer::handle_completion(const HttpRequest& req, std::shared_ptr<Exchange> ex, bool chat) {
    start_completion(caller_of(req, "http"), parse_body(req), chat, std::move(ex));
}

void OpenAiServer::start_completion(const Caller& caller, const Json& body, bool chat, std::shared_ptr<Exchange> ex) {
    PreparedCompletion prepared =
        prepare_completion(caller, body, chat ? Endpoint::ChatCompletions : Endpoint::Completions);
    const std::string name = prepared.params.model.empty() ? model_name() : prepared.params.model;
    auto job = std::make_shared<CompletionJob>(*model_, counters_, metrics_, std::move(prepared), ex, name);
    job->submit(pump_);
}

void OpenAiServer::handle_health(Exchange& ex) {
    Json j;
    const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (draining_.load(std::memory_order_acquire)) {
        j["status"] = "draining";
        j["model"] = model_name();
        j["uptime_s"] = uptime;
        j["requests_in_flight"] = admission_.requests_in_flight();
        return send_json(ex, j, 503);
    }
    if (!ready_.load(std::memory_order_acquire)) {
        j["status"] = "loading";
        j["model"] = model_name();
        j["uptime_s"] = uptime;
        return send_json(ex, j, 503);
    }
    const EngineStats s = model_->engine->stats();
    j["status"] = "ok";
    j["model"] = model_name();
    j["uptime_s"] = uptime;
    j["requests_served"] = counters_.requests_served.load();
    j["requests_aborted"] = counters_.requests_aborted.load();
    j["requests_in_flight"] = admission_.requests_in_flight();
    j["running"] = s.num_running;
    j["waiting"] = s.num_waiting;
    j["kv_cache_usage"] = s.num_kv_blocks > 0 ? static_cast<double>(s.num_kv_blocks_used) / s.num_kv_blocks : 0.0;
    j["kv_blocks_used"] = s.num_kv_blocks_used;
    j["kv_blocks_total"] = s.num_kv_blocks;
    j["prefix_cache_hit_rate"] =
        s.prefix_queries > 0 ? static_cast<double>(s.prefix_hits) / static_cast<double>(s.prefix_queries) : 0.0;
    j["preemptions"] = s.preemptions;
    j["prompt_tokens"] = s.prompt_tokens;
    j["generation_tokens"] = s.generation_tokens;
    j["memory_rss_bytes"] = rss_bytes();
    send_json(ex, j);
}

void OpenAiServer::handle_metrics(Exchange& ex) {
    const EngineStats s = ready_.load(std::memory_order_acquire) ? model_->engine->stats() : EngineStats{};
    ex.respond(200, metrics_.render(model_name(), s), "text/plain; version=0.0.4; charset=utf-8");
}

void OpenAiServer::handle_models(Exchange& ex, const std::string& id) {
    auto entry = [&](const std::string& name) {
        Json e;
        e["id"] = name;
        e["object"] = "model";
        e["created"] = created_unix_;
        e["owned_by"] = "peregrine";
        e["root"] = model_->path;
        e["parent"] = nullptr;
        e["max_model_len"] = model_->max_model_len;
        return e;
    };
    if (!id.empty()) {
        check_model(id);
        return send_json(ex, entry(id));
    }
    Json data = Json::array();
    for (const std::string& n : options_.model_names) data.push_back(entry(n));
    send_json(ex, Json{{"object", "list"}, {"data", data}});
}

void OpenAiServer::handle_tokenize(const HttpRequest& req, Exchange& ex) {
    const Json body = parse_body(req);
    const ServedModel& m = *model_;
    if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
        if (!it->is_string()) bad_param("model", "'model' must be a string");
        check_model(it->get<std::string>());
    }
    auto flag = [&](const char* key, bool def) {
        auto it = body.find(key);
        if (it == body.end() || it->is_null()) return def;
        if (!it->is_boolean()) bad_param(key, "'", key, "' must be a boolean");
        return it->get<bool>();
    };
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
        CompletionParams p;
        p.messages = normalize_messages(body["messages"]);
        p.add_generation_prompt = flag("add_generation_prompt", true);
        p.add_special_tokens = flag("add_special_tokens", false);
        if (auto k = body.find("chat_template_kwargs"); k != body.end() && k->is_object()) p.chat_template_kwargs = *k;
        ids = render_chat(p);
    } else {
        auto it = body.find("prompt");
        if (it == body.end() || !it->is_string()) bad_param("prompt", "'prompt' (a string) or 'messages' is required");
        ids = m.tokenizer->encode(it->get<std::string>(), flag("add_special_tokens", true), /*parse_special=*/true);
    }
    Json j;
    j["count"] = ids.size();
    j["max_model_len"] = m.max_model_len;
    j["tokens"] = ids;
    if (flag("return_token_strs", false)) {
        Json strs = Json::array();
        for (int32_t id : ids) strs.push_back(m.tokenizer->token(id));
        j["token_strs"] = strs;
    } else {
        j["token_strs"] = nullptr;
    }
    send_json(ex, j);
}

void OpenAiServer::handle_detokenize(const HttpRequest& req, Exchange& ex) {
    const Json body = parse_body(req);
    const ServedModel& m = *model_;
    if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
        if (!it->is_string()) bad_param("model", "'model' must be a string");
        check_model(it->get<std::string>());
    }
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) bad_param("tokens", "'tokens' (a list of token ids) is required");
    std::vector<int32_t> ids;
    for (const Json& t : *it) {
        if (!t.is_number_integer()) bad_param("tokens", "'tokens' must hold integers");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= m.vocab_size)
            bad_param("tokens", "token id ", id, " is outside the vocabulary (0..", m.vocab_size - 1, ")");
        ids.push_back(static_cast<int32_t>(id));
    }
    send_json(ex, Json{{"prompt", m.tokenizer->decode(ids)}});
}

}  // namespace peregrine::server
