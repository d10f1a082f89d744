#include "server/openai/openai_server.h"

#include <cctype>
#include <string_view>

#include "core/error.h"
#include "server/api_error.h"
#include "server/openai/handlers.h"

namespace peregrine::server {

namespace {

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

OpenAiServer::OpenAiServer(OpenAiServerOptions options)
    : service_(std::make_shared<CompletionService>(options)),
      root_path_(options.root_path),
      cors_(options.allowed_origins),
      websocket_(*service_, routes_) {
    CompletionService& s = *service_;
    auto handler = [&s](void (*fn)(CompletionService&, ApiCall&)) { return [&s, fn](ApiCall& call) { fn(s, call); }; };
    auto complete = [&s](Endpoint endpoint) {
        return [&s, endpoint](ApiCall& call) { handle_completion(s, call, endpoint); };
    };
    auto upgrade = [this](ApiCall& call) { websocket_.accept(call); };
    // The API. A /v1/ws message of type ws_type runs the same handler as its REST route.
    // clang-format off
    using enum Access;
    //           method  path                    prefix access      ws_type       handler
    while (root_path_.size() > 1 && root_path_.back() == '/') root_path_.pop_back();
    if (root_path_ == "/") root_path_.clear();
    if (!root_path_.empty() && root_path_.front() != '/') root_path_.insert(root_path_.begin(), '/');
    routes_.add({"GET",  "/health",              false, Open,       "",           handler(handle_health)});
    routes_.add({"GET",  "/metrics",             false, Open,       "",           handler(handle_metrics)});
    routes_.add({"GET",  "/ping",                false, Open,       "",           handler(handle_ping)});
    routes_.add({"GET",  "/version",             false, Open,       "",           handler(handle_version)});
    routes_.add({"POST", "/v1/completions",      false, Completion, "completion", complete(Endpoint::Completions)});
    routes_.add({"POST", "/v1/chat/completions", false, Completion, "chat",       complete(Endpoint::ChatCompletions)});
    routes_.add({"POST", "/v1/responses",        false, Completion, "response",   handler(handle_response)});
    routes_.add({"POST", "/v1/embeddings",       false, Completion, "embedding",  handler(handle_embeddings)});
    routes_.add({"GET",  "/v1/responses/",       true,  Api,        "",           handler(handle_stored_response)});
    routes_.add({"GET",  "/v1/models",           false, Api,        "",           handler(handle_models)});
    routes_.add({"GET",  "/v1/models/",          true,  Api,        "",           handler(handle_models)});
    routes_.add({"POST", "/tokenize",            false, Api,        "",           handler(handle_tokenize)});
    routes_.add({"POST", "/detokenize",          false, Api,        "",           handler(handle_detokenize)});
    routes_.add({"GET",  "/v1/ws",               false, Handshake,  "",           upgrade});
    if (options.ui)
        routes_.add({"GET", "/",                 false, Open,       "",           handler(handle_ui)});
    // clang-format on
}

OpenAiServer::~OpenAiServer() {
    shutdown();
}

void OpenAiServer::handle(const HttpRequest& req, std::shared_ptr<Exchange> raw) {
    std::shared_ptr<Exchange> ex;
    if (cors_.enabled() || service_->options().access_log)
        ex = std::make_shared<TrackedExchange>(std::move(raw), req, cors_.response_headers(req),
                                               service_->options().access_log);
    else
        ex = std::move(raw);
    if (cors_.is_allowed_preflight(req)) return ex->respond(204, "", "text/plain", cors_.preflight_headers(req));
    dispatch(req, ex);
}

void OpenAiServer::dispatch(const HttpRequest& req, const std::shared_ptr<Exchange>& ex) {
    std::string_view path = req.path;
    if (!root_path_.empty() && path.starts_with(root_path_) &&
        (path.size() == root_path_.size() || path[root_path_.size()] == '/'))
        path.remove_prefix(root_path_.size());
    if (path.empty()) path = "/";  // the root path itself: its page
    const Route* route = routes_.find(path);
    try {
        if (!route) throw ApiError(404, str_cat("no route for ", req.method, " ", req.path), "", "not_found");
        ApiCall call;
        const std::string ws_key = req.websocket_upgrade ? websocket_authorization(req) : std::string();
        call.caller =
            Caller{"http", req.websocket_upgrade ? std::string_view(ws_key) : req.header("authorization"), req.remote};
        call.ex = ex;
        call.http = &req;
        if (route->prefix) call.arg = path.substr(route->path.size());
        if (route->access != Access::Open) service_->check_caller(call.caller);
        if (route->access == Access::Api || route->access == Access::Completion) {
            if (req.method == "POST") check_json_content_type(req);
            if (route->access == Access::Api) service_->charge(call.caller);  // completions pay once admitted
        }
        RouteTable::check_method(*route, req.method, req.path);
        if (route->method == "POST") call.body = parse_json_object(req.body, "request body");
        route->handle(call);
    } catch (...) {
        const ApiError e = current_api_error();
        HeaderList extra;
        if (e.status() == 401) extra.emplace_back("WWW-Authenticate", "Bearer");
        if (e.retry_after_s() > 0) extra.emplace_back("Retry-After", std::to_string(e.retry_after_s()));
        if (e.status() == 426) extra.emplace_back("Sec-WebSocket-Version", "13");
        if (e.status() == 405 && route) extra.emplace_back("Allow", RouteTable::allow(*route));
        ex->respond(e.status(), dump(e.body()), "application/json", extra);
    }
}

}  // namespace peregrine::server
