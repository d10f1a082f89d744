// `peregrine router`: the cache-aware front door of several `peregrine serve` replicas
// (src/router). Same listener and shutdown as `serve`: SIGTERM drains.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/config.h"
#include "cli/router_front.h"
#include "cli/stop_signals.h"
#include "cli/tls_flags.h"
#include "core/error.h"
#include "server/middleware.h"

namespace peregrine::cli {

namespace {

struct RouterArgs {
    router::RouterOptions router;
    RouterFront front;
    double shutdown_timeout_s = 30;
};

int run(RouterArgs& a) {
    check_tls_flags(a.front.tls);
    const sigset_t signals = block_stop_signals();

    auto service = std::make_shared<router::RouterService>(a.router);
    service->start();
    std::unique_ptr<server::HttpServer> http = start_router_front(service, a.front);
    std::fprintf(stderr, "router: %s policy over %zu replica(s)%s%s\n", a.router.policy.c_str(),
                 a.router.backends.size(), a.router.backend_dns.empty() ? "" : " + DNS ", a.router.backend_dns.c_str());
    std::fprintf(stderr, "ready: routing at %s/v1\n", base_url(a.front.tls, a.front.host, http->port()).c_str());
    std::fflush(stderr);
    wait_and_drain(signals, *service, a.shutdown_timeout_s);
    std::fprintf(stderr, "shutting down\n");
    http->stop();
    service->stop();
    return 0;
}

}  // namespace

std::unique_ptr<server::HttpServer> start_router_front(std::shared_ptr<router::RouterService> service,
                                                       const RouterFront& front) {
    auto cors = std::make_shared<const server::CorsPolicy>(front.allowed_origins);
    server::HttpServerOptions hopts;
    hopts.host = front.host;
    hopts.port = front.port;
    hopts.tls = front.tls;
    // Every forwarded request runs on its client connection's thread (upstream reads and client
    // writes together), so these threads are the router's throughput.
    hopts.io_threads = front.io_threads > 0
                           ? front.io_threads
                           : std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 2, 8);
    auto http = std::make_unique<server::HttpServer>(
        hopts,
        [service, cors, log = front.access_log](const server::HttpRequest& req, std::shared_ptr<server::Exchange> ex) {
            if (cors->enabled() && cors->is_allowed_preflight(req)) {
                server::HeaderList h = cors->response_headers(req);
                for (auto& kv : cors->preflight_headers(req)) h.push_back(kv);
                ex->respond(204, "", "text/plain", h);
                return;
            }
            auto tracked =
                std::make_shared<server::TrackedExchange>(std::move(ex), req, cors->response_headers(req), log);
            service->handle(req, tracked);
        });
    http->start();
    return http;
}

int wait_and_drain(const sigset_t& signals, router::RouterService& service, double timeout_s) {
    int sig = 0;
    sigwait(&signals, &sig);
    service.begin_drain();
    std::fprintf(stderr, "%s: draining %lld request(s) for up to %g s\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 static_cast<long long>(service.in_flight()), timeout_s);
    std::fflush(stderr);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (service.in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
        timespec ts{0, 20'000'000};
        if (sigtimedwait(&signals, nullptr, &ts) > 0) break;
    }
    return sig;
}

std::function<int()> add_router(CLI::App& app) {
    auto args = std::make_shared<RouterArgs>();
    CLI::App* cmd = app.add_subcommand(
        "router", "Route OpenAI API requests over several `peregrine serve` replicas (cache-aware by default)");
    cmd->add_option("--host", args->front.host, "Address to listen on (default 127.0.0.1)");
    cmd->add_option("--port", args->front.port, "Port to listen on; 0 = any free port (default 8000)")
        ->check(CLI::Range(0, 65535));
    cmd->add_option("--backend", args->router.backends, "A replica, http://HOST:PORT (repeatable)");
    cmd->add_option("--backend-dns", args->router.backend_dns,
                    "NAME:PORT: every A record of NAME is a replica, re-resolved every 5 s (a Kubernetes headless "
                    "Service)");
    cmd->add_option("--policy", args->router.policy,
                    "cache-aware (where the prompt's first token comes soonest, counting the prefix each replica holds "
                    "and the prefill queued on it; least-load when load is imbalanced), "
                    "least-load (fewest outstanding requests) or round-robin (default cache-aware)")
        ->check(CLI::IsMember({"cache-aware", "least-load", "round-robin"}));
    cmd->add_option("--prefix-weight", args->router.cache_aware.prefix_weight,
                    "cache-aware: each replica costs the prefill queued there (prompt characters sent whose first "
                    "token has not come back) + 16 a request it decodes + the prompt's characters it does not hold - "
                    "(WEIGHT - 1) x those of the conversation's own history it holds; the cheapest wins; a prompt no "
                    "replica holds more of than the others goes, among those about as cheap, to the replica whose "
                    "prefix index is smallest (default 2)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--balance-abs-threshold", args->router.cache_aware.balance_abs_threshold,
                    "cache-aware: load is imbalanced (then least-load) when the busiest replica has more than this "
                    "many outstanding requests over the idlest (default 32) ...")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--balance-rel-threshold", args->router.cache_aware.balance_rel_threshold,
                    "... and more than this many times its count (default 1.5)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--api-key", args->router.api_keys,
                    "Accepted API key (repeatable; $PEREGRINE_API_KEY takes a comma-separated list; default: none)");
    add_tls_flags(cmd, args->front.tls);
    cmd->add_option("--allowed-origins", args->front.allowed_origins, "CORS: origins browsers may call from, or *");
    cmd->add_option("--health-interval", args->router.health_interval_s,
                    "Seconds between /health checks of every replica (default 1)")
        ->check(CLI::Range(0.05, 3600.0));
    cmd->add_flag("--access-log,!--no-access-log", args->front.access_log, "One JSON line per request on stderr");
    cmd->add_option("--io-threads", args->front.io_threads,
                    "I/O threads; each carries client connections and their replica connections (default: half the "
                    "cores, 2 to 8)")
        ->check(CLI::Range(1, 256));
    cmd->add_option("--shutdown-timeout", args->shutdown_timeout_s,
                    "Seconds SIGTERM waits for running requests (default 30)")
        ->check(CLI::NonNegativeNumber);
    add_config_layers(cmd);  // --config FILE and PEREGRINE_* (e.g. PEREGRINE_API_KEY) for every option above
    return [args] { return run(*args); };
}

}  // namespace peregrine::cli
