// `peregrine router`: the front door of several `peregrine serve` replicas. It answers /health
// and /metrics itself and forwards every other request to one replica chosen by the Router
// (routing.h): the body as is, the client's Authorization and X-Request-Id, the replica's status
// and body back; an event stream (SSE) is passed on as it arrives, its bytes untouched, in whole
// events. The upstream connection runs on the client connection's strand, so an event costs a
// read and a write on one thread. A WebSocket
// (/v1/ws) is joined whole to one replica's (WsBridge: text messages both ways).
//
// Failures. A replica that refuses the connection or breaks it is ejected at once (passive) and
// readmitted when its /health answers 200 again (active checks every --health-interval). A
// request whose replica failed before anything went to the client (no header, no event) is
// retried once on another replica; a stream that fails midway ends with an error event
// `{"error": {...}}` and [DONE]-less end, never a hang. A client that leaves closes the
// upstream connection, so the replica aborts the request.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "router/routing.h"
#include "server/http/exchange.h"

namespace peregrine::router {

struct RouterOptions {
    std::vector<std::string> backends;  // http://host:port of each replica
    std::string backend_dns;            // NAME:PORT: every A record of NAME is a replica (re-resolved)
    std::string policy = "cache-aware";
    CacheAwareOptions cache_aware;
    std::vector<std::string> api_keys;  // accepted Bearer keys; empty: no authentication
    double health_interval_s = 1.0;     // between active /health checks of every replica
    double dns_interval_s = 5.0;        // between resolutions of backend_dns
    double connect_timeout_s = 2.0;
    double request_timeout_s = 600.0;  // a response not complete this long after it was sent fails
    std::string model_name;            // reported by /health when set (serve --data-parallel-size)
    // Threads of the WebSocket bridges (and of forwarding for an exchange without an executor;
    // HTTP requests forward on their client connection's thread); 0: 2.
    int client_threads = 0;
};

class RouterService {
  public:
    explicit RouterService(RouterOptions options);  // throws Error for a bad URL, policy or DNS name
    ~RouterService();                               // stop()
    RouterService(const RouterService&) = delete;
    RouterService& operator=(const RouterService&) = delete;

    // Checks every replica's /health once (resolving --backend-dns first), then starts the
    // periodic checks, DNS discovery and the outbound threads.
    void start();
    void stop();
    // The HTTP server's handler (any connection's strand).
    void handle(const server::HttpRequest& req, std::shared_ptr<server::Exchange> ex);
    // SIGTERM: /health answers 503 "draining" and new requests 503; running ones finish.
    void begin_drain();
    int64_t in_flight() const;
    int healthy_replicas() const;
    // GET url/health answered 200 within timeout_s (any thread; blocking).
    static bool health_ok(const std::string& url, double timeout_s);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace peregrine::router
