#include "server/grpc/inference_service.h"

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "server/grpc/generate_reactor.h"
#include "server/grpc/proto_convert.h"
#include "server/middleware.h"
#include "server/openai/response_json.h"

namespace peregrine::server {

namespace pb = ::peregrine::v1;

namespace {

// Who calls: the metadata's authorization, the peer's address ("ipv4:1.2.3.4:5678" -> "1.2.3.4:5678").
// The Caller's views point into `ctx` and `peer`.
Caller caller_of(grpc::CallbackServerContext* ctx, std::string& peer) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string_view auth =
        it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
    peer = ctx->peer();
    if (const size_t colon = peer.find(':'); colon != std::string::npos && peer.rfind("ip", 0) == 0)
        peer.erase(0, colon + 1);
    return Caller{"grpc", auth, peer};
}

// A unary call: the caller checked and charged one request, then `f` answers; with the access
// log, its line (as Generate's, without token counts).
template <typename F>
grpc::ServerUnaryReactor* unary(CompletionService& service, grpc::CallbackServerContext* ctx, const char* method,
                                F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    std::string peer;
    const grpc::Status status = guarded([&] {
        const Caller caller = caller_of(ctx, peer);
        service.check_caller(caller);
        service.charge(caller);
        return f();
    });
    if (service.options().access_log) {
        AccessRecord a{str_cat("grpc-", random_hex_id()), peer, "GRPC", method, status.error_code(), 0, -1, -1};
        a.duration_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        write_access_log(a);
    }
    r->Finish(status);
    return r;
}

}  // namespace

grpc::ServerWriteReactor<pb::GenerateResponse>* InferenceService::Generate(grpc::CallbackServerContext* ctx,
                                                                           const pb::GenerateRequest* req) {
    std::string peer;
    const Caller caller = caller_of(ctx, peer);
    return start_generate(service_, peer, [&](Ticket* ticket, std::optional<ToolCallSetup>* tools) {
        service_.check_caller(caller);
        // The typed request the HTTP API parses from JSON, read from the proto; then the one path.
        CompletionParams params =
            completion_params_from_proto(*req, service_.sampling_limits(), service_.request_defaults());
        const bool chat = params.chat();
        if (chat) *tools = tool_call_setup(params, service_.model()->tool_call_format);
        AdmittedCompletion admitted = service_.admit(caller, std::move(params), str_cat("grpc-", random_hex_id()));
        std::shared_ptr<RequestStream> stream = service_.submit(admitted.requests, chat).front();  // one prompt
        *ticket = std::move(admitted.ticket);
        return stream;
    });
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* ctx, const pb::TokenizeRequest* req,
                                                     pb::TokenizeResponse* resp) {
    return unary(service_, ctx, "/peregrine.v1.Inference/Tokenize", [&] {
        const ServedModel& m = *service_.model();
        service_.check_model(req->model());
        std::vector<int32_t> ids;
        if (req->messages_size() > 0) {
            CompletionParams p;
            p.messages = chat_messages_json(req->messages());
            p.add_special_tokens = req->has_add_special_tokens() && req->add_special_tokens();
            ids = service_.render_chat(p);
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

grpc::ServerUnaryReactor* InferenceService::Detokenize(grpc::CallbackServerContext* ctx,
                                                       const pb::DetokenizeRequest* req, pb::DetokenizeResponse* resp) {
    return unary(service_, ctx, "/peregrine.v1.Inference/Detokenize", [&] {
        const ServedModel& m = *service_.model();
        service_.check_model(req->model());
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

grpc::ServerUnaryReactor* InferenceService::ListModels(grpc::CallbackServerContext* ctx, const pb::ListModelsRequest*,
                                                       pb::ListModelsResponse* resp) {
    return unary(service_, ctx, "/peregrine.v1.Inference/ListModels", [&] {
        for (const std::string& name : service_.options().model_names) {
            pb::Model* m = resp->add_models();
            m->set_id(name);
            m->set_max_model_len(static_cast<uint32_t>(service_.model()->max_model_len));
        }
        return grpc::Status::OK;
    });
}

}  // namespace peregrine::server
