#include "server/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <deque>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "peregrine/v1/inference.grpc.pb.h"
#include "server/api_error.h"
#include "server/middleware.h"

namespace peregrine::server {

namespace pb = ::peregrine::v1;

namespace {

// A status message travels in the HTTP/2 trailers, whose size is limited (8-16 KiB): one that
// echoes a large client input would wedge the connection. Cut to 1 KiB.
std::string status_message(std::string m) {
    constexpr size_t kMax = 1024;
    if (m.size() > kMax) {
        m.resize(kMax);
        while (!m.empty() && (static_cast<unsigned char>(m.back()) & 0xC0) == 0x80) m.pop_back();  // whole UTF-8
        if (!m.empty() && static_cast<unsigned char>(m.back()) >= 0xC0) m.pop_back();
        m += "...";
    }
    return m;
}

grpc::Status to_status(const ApiError& e) {
    grpc::StatusCode code = grpc::StatusCode::INTERNAL;
    switch (e.status()) {
        case 400:
        case 413:
        case 415:
            code = grpc::StatusCode::INVALID_ARGUMENT;
            break;
        case 401:
            code = grpc::StatusCode::UNAUTHENTICATED;
            break;
        case 404:
            code = grpc::StatusCode::NOT_FOUND;
            break;
        case 429:
            code = grpc::StatusCode::RESOURCE_EXHAUSTED;
            break;
        case 503:
            code = grpc::StatusCode::UNAVAILABLE;
            break;
        default:
            break;
    }
    return {code, status_message(e.param().empty() ? std::string(e.what()) : str_cat(e.param(), ": ", e.what()))};
}

// Runs `f` and turns what it throws into a status.
template <typename F>
grpc::Status guarded(F&& f) {
    try {
        return f();
    } catch (...) {
        return to_status(current_api_error());  // the HTTP API's mapping, as a gRPC status
    }
}

pb::GenerateResponse to_proto(const RequestOutput& o) {
    pb::GenerateResponse r;
    r.set_text(o.text);
    for (int32_t id : o.token_ids) r.add_token_ids(static_cast<uint32_t>(id));
    r.set_index(static_cast<uint32_t>(o.index));
    if (o.finish != FinishReason::None) r.set_finish_reason(finish_reason_name(o.finish));
    for (const TokenLogprob& lp : o.logprobs) {
        pb::TokenLogprob* t = r.add_logprobs();
        t->set_token_id(static_cast<uint32_t>(lp.token));
        t->set_logprob(lp.logprob);
        for (const auto& [id, v] : lp.top) {
            pb::TopLogprob* a = t->add_top();
            a->set_token_id(static_cast<uint32_t>(id));
            a->set_logprob(v);
        }
    }
    if (o.usage) {
        pb::Usage* u = r.mutable_usage();
        u->set_prompt_tokens(static_cast<uint32_t>(o.usage->prompt_tokens));
        u->set_completion_tokens(static_cast<uint32_t>(o.usage->completion_tokens));
        u->set_total_tokens(static_cast<uint32_t>(o.usage->prompt_tokens + o.usage->completion_tokens));
        u->set_cached_tokens(static_cast<uint32_t>(o.usage->cached_tokens));
    }
    return r;
}

// The request as the HTTP API's JSON body, so that both are checked by the same parser.
Json to_json(const pb::GenerateRequest& req, bool chat) {
    Json body = Json::object();
    if (!req.model().empty()) body["model"] = req.model();
    if (chat) {
        Json msgs = Json::array();
        for (const pb::ChatMessage& m : req.messages()) msgs.push_back({{"role", m.role()}, {"content", m.content()}});
        body["messages"] = std::move(msgs);
    } else if (req.prompt_ids_size() > 0) {
        Json ids = Json::array();
        for (uint32_t id : req.prompt_ids()) ids.push_back(static_cast<int64_t>(id));
        body["prompt"] = std::move(ids);
    } else {
        body["prompt"] = req.prompt();
    }
    if (req.max_tokens() > 0) body["max_tokens"] = req.max_tokens();
    if (req.has_temperature()) body["temperature"] = req.temperature();
    if (req.has_top_p()) body["top_p"] = req.top_p();
    if (req.top_k() > 0) body["top_k"] = req.top_k();
    if (req.has_seed()) body["seed"] = static_cast<int64_t>(req.seed());
    if (req.ignore_eos()) body["ignore_eos"] = true;
    if (req.stop_size() > 0) {
        Json stop = Json::array();
        for (const std::string& s : req.stop()) stop.push_back(s);
        body["stop"] = std::move(stop);
    }
    if (req.n() > 0) body["n"] = req.n();
    if (req.priority() != 0) body["priority"] = req.priority();
    if (req.has_logprobs()) {
        if (chat) {
            body["logprobs"] = true;
            body["top_logprobs"] = req.logprobs();
        } else {
            body["logprobs"] = req.logprobs();
        }
    }
    return body;
}

// One Generate stream: engine outputs arrive from the StreamPump thread and are written one at a
// time; a cancel (client gone, deadline passed) aborts the engine request.
class GenerateReactor : public grpc::ServerWriteReactor<pb::GenerateResponse> {
  public:
    GenerateReactor(OpenAiServer& app, std::string peer)
        : app_(app), peer_(std::move(peer)), start_(std::chrono::steady_clock::now()) {}

    static GenerateReactor* create(OpenAiServer& app, std::string peer, std::shared_ptr<GenerateReactor>* out) {
        auto r = std::make_shared<GenerateReactor>(app, std::move(peer));
        r->self_ = r;
        *out = r;
        return r.get();
    }

    void fail(const grpc::Status& status) {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        finish(status);
    }

    void start(const std::shared_ptr<GenerateReactor>& self, const std::shared_ptr<RequestStream>& stream,
               Ticket ticket) {
        id_ = stream->id();
        started_ = true;
        ticket_ = std::move(ticket);
        app_.pump().add({stream},
                        [self](std::vector<RequestOutput>&& outs, bool done) { self->deliver(std::move(outs), done); });
    }

    void OnWriteDone(bool ok) override {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        writing_ = false;
        if (!ok) cancelled_ = true;
        write_next();
    }

    void OnCancel() override {
        {
            std::lock_guard<std::recursive_mutex> lock(mu_);
            cancelled_ = true;
            if (started_ && !ended_ && app_.model()) app_.model()->engine->abort(id_);
            write_next();
        }
    }

    void OnDone() override {
        std::shared_ptr<GenerateReactor> keep;
        std::lock_guard<std::recursive_mutex> lock(mu_);
        keep = std::move(self_);  // the pump's sink may still hold one
        done_ = true;
    }

  private:
    void deliver(std::vector<RequestOutput>&& outs, bool done) {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        for (const RequestOutput& o : outs) {
            if (o.usage && o.timing) app_.metrics().observe_request(o.finish, *o.usage, *o.timing);
            if (o.usage) usage_ = *o.usage;
        }
        if (done) {
            ticket_.release();
            ++(cancelled_ || finished_ ? app_.counters().requests_aborted : app_.counters().requests_served);
        }
        if (finished_) return;
        for (const RequestOutput& o : outs) queue_.push_back(to_proto(o));
        ended_ |= done;
        write_next();
    }

    // Ends the call (once) and writes its access-log line.
    void finish(const grpc::Status& status) {
        finished_ = true;
        if (app_.options().access_log) {
            AccessRecord r{id_,
                           peer_,
                           "GRPC",
                           "/peregrine.v1.Inference/Generate",
                           status.error_code(),
                           0,
                           usage_ ? usage_->prompt_tokens : -1,
                           usage_ ? usage_->completion_tokens : -1};
            r.duration_ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
            write_access_log(r);
        }
        Finish(status);
    }

    void write_next() {
        if (writing_ || finished_) return;
        if (cancelled_) {
            finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
        } else if (!queue_.empty()) {
            current_ = std::move(queue_.front());
            queue_.pop_front();
            writing_ = true;
            StartWrite(&current_);
        } else if (ended_) {
            finish(grpc::Status::OK);
        }
    }

    OpenAiServer& app_;
    const std::string peer_;
    const std::chrono::steady_clock::time_point start_;
    std::optional<Usage> usage_;             // from the request's last output
    std::shared_ptr<GenerateReactor> self_;  // until OnDone
    std::recursive_mutex mu_;                // gRPC may run reactions inline
    std::string id_;
    Ticket ticket_;  // the request's share of the in-flight limits, until its last output
    std::deque<pb::GenerateResponse> queue_;
    pb::GenerateResponse current_;
    bool started_ = false, writing_ = false, ended_ = false, cancelled_ = false, finished_ = false, done_ = false;
};

}  // namespace

class InferenceService final : public pb::Inference::CallbackService {
  public:
    explicit InferenceService(OpenAiServer& app) : app_(app) {}

    grpc::ServerWriteReactor<pb::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                             const pb::GenerateRequest* req) override {
        std::shared_ptr<GenerateReactor> r;
        std::string peer;
        const Caller caller = caller_of(ctx, peer);
        GenerateReactor* raw = GenerateReactor::create(app_, peer, &r);
        std::shared_ptr<RequestStream> stream;
        Ticket ticket;
        grpc::Status s = guarded([&] {
            app_.check_caller(caller);
            stream = submit(caller, *req, ticket);
            return grpc::Status::OK;
        });
        if (!s.ok())
            raw->fail(s);
        else
            raw->start(r, stream, std::move(ticket));
        return raw;
    }

    grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const pb::TokenizeRequest* req,
                                       pb::TokenizeResponse* resp) override {
        return unary(ctx, [&] {
            const ServedModel& m = *app_.model();
            app_.check_model(req->model());
            std::vector<int32_t> ids;
            if (req->messages_size() > 0) {
                CompletionParams p;
                Json msgs = Json::array();
                for (const pb::ChatMessage& mm : req->messages())
                    msgs.push_back({{"role", mm.role()}, {"content", mm.content()}});
                p.messages = normalize_messages(msgs);
                p.add_special_tokens = req->has_add_special_tokens() && req->add_special_tokens();
                ids = app_.render_chat(p);
            } else {
                ids = m.tokenizer->encode(req->prompt(), !req->has_add_special_tokens() || req->add_special_tokens(),
                                          /*parse_special=*/true);
            }
            for (int32_t id : ids) resp->add_token_ids(static_cast<uint32_t>(id));
            resp->set_count(static_cast<uint32_t>(ids.size()));
            resp->set_max_model_len(static_cast<uint32_t>(m.max_model_len));
            return grpc::Status::OK;
        });
    }

    grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const pb::DetokenizeRequest* req,
                                         pb::DetokenizeResponse* resp) override {
        return unary(ctx, [&] {
            const ServedModel& m = *app_.model();
            app_.check_model(req->model());
            std::vector<int32_t> ids;
            for (uint32_t id : req->token_ids()) {
                if (id >= static_cast<uint32_t>(m.vocab_size))
                    bad_param("token_ids", "token id ", id, " is outside the vocabulary (0..", m.vocab_size - 1, ")");
                ids.push_back(static_cast<int32_t>(id));
            }
            resp->set_text(m.tokenizer->decode(ids));
            return grpc::Status::OK;
        });
    }

    grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const pb::ListModelsRequest*,
                                         pb::ListModelsResponse* resp) override {
        return unary(ctx, [&] {
            for (const std::string& name : app_.options().model_names) {
                pb::Model* m = resp->add_models();
                m->set_id(name);
                m->set_max_model_len(static_cast<uint32_t>(app_.model()->max_model_len));
            }
            return grpc::Status::OK;
        });
    }

  private:
    // Who calls: the metadata's authorization, the peer's address ("ipv4:1.2.3.4:5678" -> "1.2.3.4:5678").
    static Caller caller_of(grpc::CallbackServerContext* ctx, std::string& peer) {
        const auto& md = ctx->client_metadata();
        auto it = md.find("authorization");
        const std::string_view auth =
            it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
        peer = ctx->peer();
        if (const size_t colon = peer.find(':'); colon != std::string::npos && peer.rfind("ip", 0) == 0)
            peer.erase(0, colon + 1);
        return Caller{"grpc", auth, peer};
    }

    template <typename F>
    grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* ctx, F&& f) {
        grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
        r->Finish(guarded([&] {
            std::string peer;
            const Caller caller = caller_of(ctx, peer);
            app_.check_caller(caller);
            app_.charge(caller);
            return f();
        }));
        return r;
    }

    // Checks and admits the request as the HTTP API does (one path), and submits it to the engine.
    std::shared_ptr<RequestStream> submit(const Caller& caller, const pb::GenerateRequest& req, Ticket& ticket) {
        const bool chat = req.messages_size() > 0;
        const int given = (chat ? 1 : 0) + (req.prompt_ids_size() > 0 ? 1 : 0) + (req.prompt().empty() ? 0 : 1);
        if (given != 1) bad_param("prompt", "exactly one of 'prompt', 'prompt_ids' or 'messages' is required");
        PreparedCompletion p = app_.prepare_completion(caller, to_json(req, chat),
                                                       chat ? Endpoint::ChatCompletions : Endpoint::Completions);
        Request r;
        r.id = str_cat("grpc-", random_hex_id());
        r.prompt_ids = std::move(p.prompts.front());
        r.sampling = p.params.sampling;
        r.priority = p.params.priority;
        auto stream = app_.submit(std::move(r), chat);
        ticket = std::move(p.ticket);
        return stream;
    }

    OpenAiServer& app_;
};

GrpcServer::GrpcServer(GrpcServerOptions options, std::shared_ptr<OpenAiServer> app)
    : options_(std::move(options)), app_(std::move(app)) {}

GrpcServer::~GrpcServer() {
    stop();
}

void GrpcServer::start() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    service_ = std::make_unique<InferenceService>(*app_);
    grpc::ServerBuilder builder;
    const std::string host = options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
    builder.AddListeningPort(str_cat(host, ":", options_.port), grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
        server_.reset();
        throw Error(str_cat("cannot listen for gRPC on ", host, ":", options_.port));
    }
    set_serving(false);
}

void GrpcServer::set_serving(bool serving) {
    if (server_ && server_->GetHealthCheckService()) server_->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcServer::stop() {
    if (!server_) return;
    set_serving(false);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
}

}  // namespace peregrine::server
