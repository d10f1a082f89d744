// The API's routes in one table: path, method, who may call (Access), the /v1/ws message type
// that reaches the same handler, and the handler. REST requests (openai_server.cc) and WebSocket
// messages (websocket_api.cc) are dispatched through it; handlers see an ApiCall, never the
// transport.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/admission.h"
#include "server/http/exchange.h"
#include "server/openai/json.h"

namespace peregrine::server {

// One call of a route, whatever carried it.
struct ApiCall {
    Caller caller;                      // views into the HTTP request or the WebSocket connection
    std::string_view arg;               // a prefix route's rest of the path (/v1/models/{id}), else ""
    Json body;                          // a POST route's request object (parsed), else null
    std::shared_ptr<Exchange> ex;       // where the answer goes
    const HttpRequest* http = nullptr;  // the HTTP request (the WebSocket handshake reads it); null on /v1/ws
};

// What a caller must pass before the handler runs.
enum class Access {
    Open,        // nothing: answered while loading or draining, without a key (health, metrics)
    Handshake,   // the caller (key, loaded, not draining); nothing charged: each WebSocket message pays
    Api,         // the caller, and one request charged to its rate limit
    Completion,  // the caller; charged by admission once the request's tokens are known
};

struct Route {
    std::string method;  // "GET" (HEAD too: the HTTP layer leaves out the body) or "POST"
    std::string path;    // exact; with `prefix`, every path under it (the rest is ApiCall::arg)
    bool prefix = false;
    Access access = Access::Api;
    std::string ws_type;  // the /v1/ws message "type" that calls this route; "" for none
    std::function<void(ApiCall&)> handle;
};

class RouteTable {
  public:
    void add(Route route) { routes_.push_back(std::move(route)); }
    // The route serving `path` (whatever the method), or null.
    const Route* find(std::string_view path) const;
    // The route a /v1/ws message of this type calls, or null.
    const Route* find_ws(std::string_view type) const;
    // Throws ApiError(405) unless `method` is the route's (HEAD counts as GET).
    static void check_method(const Route& route, std::string_view method, std::string_view path);
    // The Allow header of a 405 from this route: "GET, HEAD" or "POST".
    static std::string allow(const Route& route) { return route.method == "GET" ? "GET, HEAD" : route.method; }

  private:
    std::vector<Route> routes_;
};

}  // namespace peregrine::server
