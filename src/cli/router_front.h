// The HTTP side of a router (`peregrine router`, and `serve --data-parallel-size`): the listener,
// CORS preflights and headers, the access log, then the RouterService's handler.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "router/router_server.h"
#include "server/http/http_server.h"

namespace peregrine::cli {

struct RouterFront {
    std::string host = "127.0.0.1";
    int port = 8000;
    std::vector<std::string> allowed_origins;
    bool access_log = false;
    int io_threads = 0;
    server::TlsOptions tls;  // --ssl-*: the front serves TLS only
};

// Listening (the port is the server's port() when 0 was asked for).
std::unique_ptr<server::HttpServer> start_router_front(std::shared_ptr<router::RouterService> service,
                                                       const RouterFront& front);

// Waits for SIGINT / SIGTERM (blocked by the caller), drains the service for up to `timeout_s`.
// Returns the signal.
int wait_and_drain(const sigset_t& signals, router::RouterService& service, double timeout_s);

}  // namespace peregrine::cli
