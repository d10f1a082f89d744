#include "router/router_server.h"

#include <netdb.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "router/routing.h"
#include "server/admission.h"
#include "server/api_error.h"
#include "server/metrics.h"

namespace peregrine::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

struct HostPort {
    std::string host;
    std::string port;
};

// http://host:port (no path, no https): what a replica's URL may be.
HostPort parse_backend(const std::string& url) {
    const std::string scheme = "http://";
    if (url.rfind(scheme, 0) != 0) fail("--backend '", url, "': must start with http:// (e.g. http://10.0.0.5:8000)");
    std::string rest = url.substr(scheme.size());
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    const size_t colon = rest.rfind(':');
    if (rest.empty() || rest.find('/') != std::string::npos || colon == std::string::npos || colon == 0)
        fail("--backend '", url, "': expected http://HOST:PORT");
    const std::string port = rest.substr(colon + 1);
    int p = 0;
    try {
        p = std::stoi(port);
    } catch (...) {
        p = 0;
    }
    if (p < 1 || p > 65535 || std::to_string(p) != port) fail("--backend '", url, "': bad port '", port, "'");
    return {rest.substr(0, colon), port};
}

std::string error_json(const std::string& message, const std::string& type = "server_error") {
    return json{{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}}.dump();
}

// What the prefix index keys on (the prompt as text) and the session key of an API request: its
// `prompt_cache_key`, else the X-Session-ID header (vLLM's router and llm-d key sessions by it),
// else its `user`.
void prompt_facts(const std::string& path, const std::string& body, std::string_view session_header, std::string& text,
                  std::string& session) {
    if (path != "/v1/completions" && path != "/v1/chat/completions" && path != "/v1/responses") return;
    const json j = json::parse(body, nullptr, false);
    if (!j.is_object()) return;
    if (j.contains("prompt_cache_key") && j["prompt_cache_key"].is_string())
        session = j["prompt_cache_key"].get<std::string>();
    else if (!session_header.empty())
        session = std::string(session_header);
    else if (j.contains("user") && j["user"].is_string())
        session = j["user"].get<std::string>();
    if (j.contains("messages") && j["messages"].is_array()) {
        for (const json& m : j["messages"]) {
            if (!m.is_object()) continue;
            text += m.value("role", "");
            text += ": ";
            const json& c = m.contains("content") ? m["content"] : json();
            text += c.is_string() ? c.get<std::string>() : c.dump();
            text += "\n";
        }
    } else if (j.contains("prompt") || j.contains("input")) {  // completions; responses
        const json& p = j.contains("prompt") ? j["prompt"] : j["input"];
        if (j.contains("instructions") && j["instructions"].is_string()) text = j["instructions"].get<std::string>();
        text += p.is_string() ? p.get<std::string>() : p.dump();
    }
}

// Whether whole SSE events `out` of a response to `path` carry generated output, so that the
// prompt's prefill is done: a chat stream opens with a role-only chunk and a Responses stream
// with lifecycle events, both sent before the prefill; a completions stream's first event is its
// first token (an echoed prompt, also sent before, is the one case counted early).
bool carries_a_token(std::string_view out, std::string_view path) {
    size_t at = 0;
    while (at < out.size()) {
        size_t end = out.find("\n\n", at);
        if (end == std::string_view::npos) end = out.size();
        const std::string_view event = out.substr(at, end - at);
        at = end + 2;
        if (path == "/v1/chat/completions" ? event.find("\"role\":\"assistant\"") == std::string_view::npos
            : path == "/v1/responses"      ? event.find(".delta\"") != std::string_view::npos
                                           : !event.empty())
            return true;
    }
    return false;
}

// Holds back a partial event: a replica's stream goes on to the client in whole events (so a
// stream that fails midway can still end with a well-formed error event).
class WholeEvents {
  public:
    // The whole events available after `bytes` (valid until the next call; may be empty).
    std::string_view feed(std::string_view bytes) {
        buf_.erase(0, sent_);
        buf_.append(bytes);
        const size_t end = buf_.rfind("\n\n");
        sent_ = end == std::string::npos ? 0 : end + 2;
        return std::string_view(buf_).substr(0, sent_);
    }

  private:
    std::string buf_;  // [0, sent_) went out with the last feed; the rest is a partial event
    size_t sent_ = 0;
};

// An endpoint for host:port without asking the resolver when the host is a numeric address
// (asio resolves on one background thread: a round trip per request under load).
asio::awaitable<tcp::resolver::results_type> endpoints_of(const std::string& host, const std::string& port,
                                                          beast::error_code& ec) {
    const auto addr = asio::ip::make_address(host, ec);
    if (!ec) {
        const tcp::endpoint e(addr, static_cast<unsigned short>(std::stoi(port)));
        co_return tcp::resolver::results_type::create(e, host, port);
    }
    ec = {};
    tcp::resolver resolver(co_await asio::this_coro::executor);
    co_return co_await resolver.async_resolve(host, port, asio::redirect_error(asio::use_awaitable, ec));
}

// A busy replica still answers /health from its I/O threads, but not always within a few ms on
// a loaded host: a dead one refuses at once, so a generous timeout costs nothing.
constexpr double kHealthTimeoutS = 2.0;

std::vector<double> latency_buckets() {
    return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

// A client's WebSocket (/v1/ws) joined to one replica's: text messages both ways, in order; when
// either side ends, so does the other. Upstream I/O runs on `strand`; the client side on its
// connection's strand (server::WebSocket::post).
class WsBridge : public std::enable_shared_from_this<WsBridge> {
  public:
    using Upstream = beast::websocket::stream<beast::tcp_stream>;
    WsBridge(asio::strand<asio::io_context::executor_type> strand, std::shared_ptr<server::WebSocket> client)
        : strand_(strand), up_(strand), client_(std::move(client)) {}

    // Connects to the replica, then reads it until it closes.
    asio::awaitable<void> run(HostPort hp, std::string authorization, std::function<void(bool)> done) {
        const auto self = shared_from_this();  // the coroutine outlives the client's callbacks
        beast::error_code ec;
        tcp::resolver resolver(strand_);
        const auto endpoints =
            co_await resolver.async_resolve(hp.host, hp.port, asio::redirect_error(asio::use_awaitable, ec));
        if (!ec) {
            beast::get_lowest_layer(up_).expires_after(std::chrono::seconds(5));
            co_await beast::get_lowest_layer(up_).async_connect(endpoints,
                                                                asio::redirect_error(asio::use_awaitable, ec));
        }
        if (!ec) {
            beast::get_lowest_layer(up_).expires_never();
            up_.set_option(beast::websocket::stream_base::timeout::suggested(beast::role_type::client));
            up_.set_option(beast::websocket::stream_base::decorator([authorization](beast::websocket::request_type& r) {
                if (!authorization.empty()) r.set(http::field::authorization, authorization);
            }));
            co_await up_.async_handshake(hp.host + ":" + hp.port, "/v1/ws",
                                         asio::redirect_error(asio::use_awaitable, ec));
        }
        if (ec) {
            close_client();
            done(true);
            co_return;
        }
        open_ = true;
        flush();
        beast::flat_buffer buf;
        for (;;) {
            co_await up_.async_read(buf, asio::redirect_error(asio::use_awaitable, ec));
            if (ec) break;
            std::string text = beast::buffers_to_string(buf.data());
            buf.consume(buf.size());
            client_->post([c = client_, text = std::move(text)]() mutable {
                if (!c->closed()) c->send(std::move(text));
            });
        }
        open_ = false;
        close_client();
        done(ec != beast::websocket::error::closed);
    }

    // A message from the client (any thread).
    void to_upstream(std::string text) {
        asio::post(strand_, [self = shared_from_this(), text = std::move(text)]() mutable {
            self->pending_.push_back(std::move(text));
            self->flush();
        });
    }
    // The client went away (any thread).
    void client_closed() {
        asio::post(strand_, [self = shared_from_this()] {
            self->client_gone_ = true;
            if (self->open_ && !self->writing_) self->close_upstream();
        });
    }

  private:
    void flush() {  // strand
        if (!open_ || writing_) return;
        if (pending_.empty()) {
            if (client_gone_) close_upstream();
            return;
        }
        writing_ = true;
        up_.text(true);
        up_.async_write(asio::buffer(pending_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
            self->writing_ = false;
            self->pending_.pop_front();
            if (ec) {
                self->close_client();
                return;
            }
            self->flush();
        });
    }
    void close_upstream() {  // strand
        open_ = false;
        up_.async_close(beast::websocket::close_code::normal, [self = shared_from_this()](beast::error_code) {});
    }
    void close_client() {
        client_->post([c = client_] {
            if (!c->closed()) c->close();
        });
    }

    asio::strand<asio::io_context::executor_type> strand_;
    Upstream up_;
    std::shared_ptr<server::WebSocket> client_;
    std::deque<std::string> pending_;  // client messages not yet written upstream
    bool open_ = false, writing_ = false, client_gone_ = false;
};

}  // namespace

struct RouterService::Impl {
    RouterOptions options;
    Router router;
    asio::io_context ioc;
    asio::executor_work_guard<asio::io_context::executor_type> work{ioc.get_executor()};
    std::vector<std::thread> threads;
    std::thread checker;
    std::mutex stop_mu;
    std::condition_variable stop_cv;
    bool stopping = false;
    std::atomic<bool> draining{false};
    std::atomic<int64_t> in_flight{0};
    std::string dns_host, dns_port;

    mutable std::mutex metrics_mu;
    std::map<std::string, server::Histogram> latency;  // by replica URL
    uint64_t retries = 0, no_replica = 0, midstream_failures = 0;

    Impl(RouterOptions o)
        : options(std::move(o)), router(policy_from_name(options.policy), options.backends, options.cache_aware) {
        for (const std::string& b : options.backends) parse_backend(b);
        if (!options.backend_dns.empty()) {
            const size_t colon = options.backend_dns.rfind(':');
            if (colon == std::string::npos || colon == 0)
                fail("--backend-dns '", options.backend_dns, "': expected NAME:PORT");
            dns_host = options.backend_dns.substr(0, colon);
            dns_port = options.backend_dns.substr(colon + 1);
            parse_backend("http://" + dns_host + ":" + dns_port);  // checks the port
        }
        if (options.backends.empty() && options.backend_dns.empty())
            fail("peregrine router: give at least one --backend URL or --backend-dns NAME:PORT");
    }

    void observe(const std::string& url, double seconds) {
        std::lock_guard lock(metrics_mu);
        auto it = latency.find(url);
        if (it == latency.end()) it = latency.emplace(url, server::Histogram(latency_buckets())).first;
        it->second.observe(seconds);
    }

    // ---- active checks and discovery (one thread) ------------------------------------------

    // GET `path` of a replica: its status (0: no answer) and body.
    static int get(const std::string& url, const char* path, double timeout_s, std::string* body = nullptr) {
        try {
            const HostPort hp = parse_backend(url);
            asio::io_context io;
            beast::tcp_stream stream(io);
            stream.expires_after(std::chrono::milliseconds(static_cast<int>(timeout_s * 1000)));
            tcp::resolver resolver(io);
            stream.connect(resolver.resolve(hp.host, hp.port));
            http::request<http::empty_body> req{http::verb::get, path, 11};
            req.set(http::field::host, hp.host);
            http::write(stream, req);
            beast::flat_buffer buf;
            http::response<http::string_body> res;
            http::read(stream, buf, res);
            if (body) *body = std::move(res.body());
            return res.result_int();
        } catch (...) {
            return 0;
        }
    }

    static bool health_ok(const std::string& url, double timeout_s) { return get(url, "/health", timeout_s) == 200; }

    std::vector<std::string> resolve_dns() const {
        addrinfo hints{};
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* found = nullptr;
        std::vector<std::string> urls;
        if (::getaddrinfo(dns_host.c_str(), dns_port.c_str(), &hints, &found) != 0) return urls;
        for (addrinfo* a = found; a; a = a->ai_next) {
            char ip[64];
            if (::getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof(ip), nullptr, 0, NI_NUMERICHOST) == 0) {
                const std::string u = "http://" + std::string(ip) + ":" + dns_port;
                if (std::find(urls.begin(), urls.end(), u) == urls.end()) urls.push_back(u);
            }
        }
        ::freeaddrinfo(found);
        std::sort(urls.begin(), urls.end());
        return urls;
    }

    // One round: DNS when due, then every replica's /health.
    void check_once(Clock::time_point& next_dns) {
        if (!dns_host.empty() && Clock::now() >= next_dns) {
            const std::vector<std::string> urls = resolve_dns();
            if (!urls.empty()) router.set_urls(urls);  // a failed lookup keeps the last set
            next_dns = Clock::now() + std::chrono::milliseconds(static_cast<int>(options.dns_interval_s * 1000));
        }
        for (const ReplicaState& r : router.snapshot()) {
            const bool ok = health_ok(r.url, kHealthTimeoutS);
            router.set_healthy(r.id, ok);
            // The cache-aware index sizes itself from each replica's KV pool (routing.h).
            std::string metrics;
            if (ok && router.policy() == Policy::CacheAware && get(r.url, "/metrics", kHealthTimeoutS, &metrics) == 200)
                router.observe_cache(r.id, parse_cache_facts(metrics));
        }
    }

    void check_loop(Clock::time_point next_dns) {
        for (;;) {
            std::unique_lock lock(stop_mu);
            if (stop_cv.wait_for(lock, std::chrono::milliseconds(static_cast<int>(options.health_interval_s * 1000)),
                                 [&] { return stopping; }))
                return;
            lock.unlock();
            check_once(next_dns);
        }
    }

    // ---- forwarding ------------------------------------------------------------------------

    struct Job {
        std::string method, path, body, content_type, authorization, request_id, session_header, text, session;
        std::shared_ptr<server::Exchange> ex;
        std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
        std::shared_ptr<std::function<void()>> cancel = std::make_shared<std::function<void()>>();
        std::shared_ptr<std::mutex> cancel_mu = std::make_shared<std::mutex>();
        // The job's coroutine and its cancel run here, never at once: the client connection's
        // strand (then `on_exchange_strand`), else a strand of the router's own threads.
        asio::any_io_executor exec;
        bool on_exchange_strand = false;
    };

    // Runs `fn` on the exchange's strand: at once when the job already runs there.
    static void deliver(const Job& job, std::function<void(server::Exchange&)> fn) {
        if (job.on_exchange_strand) return fn(*job.ex);
        job.ex->post([ex = job.ex, fn = std::move(fn)] { fn(*ex); });
    }

    enum class Outcome { Done, RetryElsewhere };

    asio::awaitable<Outcome> try_replica(Job& job, const Decision& d, bool last_attempt) {
        const auto t0 = Clock::now();
        const HostPort hp = parse_backend(d.url);
        auto ex_exec = co_await asio::this_coro::executor;
        beast::tcp_stream stream(ex_exec);
        {
            std::lock_guard lock(*job.cancel_mu);
            *job.cancel = [&stream] {
                beast::error_code ignored;
                stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
                stream.socket().close(ignored);
            };
        }
        auto clear_cancel = [&] {
            std::lock_guard lock(*job.cancel_mu);
            *job.cancel = nullptr;
        };
        beast::error_code ec;
        const auto endpoints = co_await endpoints_of(hp.host, hp.port, ec);
        if (!ec) {
            stream.expires_after(std::chrono::milliseconds(static_cast<int>(options.connect_timeout_s * 1000)));
            co_await stream.async_connect(endpoints, asio::redirect_error(asio::use_awaitable, ec));
        }
        http::request<http::string_body> req{http::string_to_verb(job.method), job.path, 11};
        req.set(http::field::host, hp.host + ":" + hp.port);
        if (!job.content_type.empty()) req.set(http::field::content_type, job.content_type);
        if (!job.authorization.empty()) req.set(http::field::authorization, job.authorization);
        req.set("X-Request-Id", job.request_id);
        if (!job.session_header.empty()) req.set("X-Session-ID", job.session_header);
        req.body() = job.body;
        req.prepare_payload();
        beast::flat_buffer buffer;
        http::response_parser<http::buffer_body> parser;
        parser.body_limit(std::numeric_limits<std::uint64_t>::max());
        if (!ec) {
            stream.socket().set_option(tcp::no_delay(true), ec);
            stream.expires_after(std::chrono::milliseconds(static_cast<int>(options.request_timeout_s * 1000)));
            co_await http::async_write(stream, req, asio::redirect_error(asio::use_awaitable, ec));
        }
        if (!ec)
            co_await http::async_read_header(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) {  // nothing reached the client: eject, and try another replica once
            clear_cancel();
            router.finish(d, true);
            if (!job.gone->load()) router.set_healthy(d.id, false);
            if (!last_attempt && !job.gone->load()) co_return Outcome::RetryElsewhere;
            deliver(job, [msg = "replica " + d.url + " failed: " + ec.message()](server::Exchange& x) {
                if (!x.client_gone()) x.respond(502, error_json(msg));
            });
            co_return Outcome::Done;
        }
        const int status = parser.get().result_int();
        const std::string type(parser.get()[http::field::content_type]);
        const bool events = status == 200 && type.rfind("text/event-stream", 0) == 0;
        WholeEvents events_out;
        std::string whole;
        bool started = false, failed = false, prefilled = false;
        char chunk[16384];
        while (!parser.is_done()) {
            parser.get().body().data = chunk;
            parser.get().body().size = sizeof(chunk);
            co_await http::async_read_some(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
            if (ec == http::error::need_buffer) ec = {};
            const size_t got = sizeof(chunk) - parser.get().body().size;
            if (events) {
                // The replica's framing goes on as it is, whole events at a time.
                const std::string_view out = events_out.feed(std::string_view(chunk, got));
                if (!out.empty()) {
                    const bool first = !started;
                    started = true;
                    if (!prefilled && carries_a_token(out, job.path)) {
                        prefilled = true;
                        router.first_token(d);
                    }
                    if (job.on_exchange_strand) {
                        if (!job.ex->client_gone()) {
                            if (first) job.ex->start_events();
                            job.ex->send_framed_events(out);
                        }
                    } else {
                        deliver(job, [first, out = std::string(out)](server::Exchange& x) {
                            if (x.client_gone()) return;
                            if (first) x.start_events();
                            x.send_framed_events(out);
                        });
                    }
                }
            } else {
                whole.append(chunk, got);
            }
            if (ec) {
                failed = true;
                break;
            }
        }
        clear_cancel();
        if (failed && !job.gone->load()) {
            router.set_healthy(d.id, false);
            if (events && !started && !last_attempt) {  // no byte went out yet: retry
                router.finish(d, true);
                co_return Outcome::RetryElsewhere;
            }
            {
                std::lock_guard lock(metrics_mu);
                ++midstream_failures;
            }
            const std::string msg = "replica " + d.url + " failed during the response: " + ec.message();
            if (events) {  // a partial event held back by events_out is dropped
                deliver(job, [msg, started](server::Exchange& x) {
                    if (x.client_gone()) return;
                    if (!started) x.start_events();
                    x.send_event(error_json(msg));
                    x.end_events();
                });
            } else {
                deliver(job, [msg](server::Exchange& x) {
                    if (!x.client_gone()) x.respond(502, error_json(msg));
                });
            }
        } else if (events) {
            deliver(job, [started](server::Exchange& x) {
                if (x.client_gone()) return;
                if (!started) x.start_events();
                x.end_events();
            });
        } else {
            deliver(job, [status, whole = std::move(whole), type](server::Exchange& x) mutable {
                if (!x.client_gone()) x.respond(status, std::move(whole), type.empty() ? "application/json" : type);
            });
        }
        router.finish(d, failed);
        observe(d.url, std::chrono::duration<double>(Clock::now() - t0).count());
        beast::error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
        co_return Outcome::Done;
    }

    asio::awaitable<void> forward(std::shared_ptr<Job> job) {
        int exclude = -1;
        for (int attempt = 0; attempt < 2; ++attempt) {
            const Decision d = router.pick(job->text, job->session, exclude);
            if (d.replica < 0) {
                {
                    std::lock_guard lock(metrics_mu);
                    ++no_replica;
                }
                deliver(*job, [](server::Exchange& x) {
                    if (!x.client_gone()) x.respond(503, error_json("no healthy replica to serve the request"));
                });
                break;
            }
            if (attempt > 0) {
                std::lock_guard lock(metrics_mu);
                ++retries;
            }
            if (co_await try_replica(*job, d, attempt == 1) == Outcome::Done) break;
            exclude = d.replica;
        }
        --in_flight;
    }

    std::string metrics_text() const {
        server::PrometheusWriter w;
        const std::vector<ReplicaState> rs = router.snapshot();
        auto per_replica = [&](const char* name, const char* type, const char* help, auto value) {
            w.header(name, type, help);
            for (const ReplicaState& r : rs)
                w.sample(name, "backend=\"" + server::escape_label(r.url) + "\"", static_cast<double>(value(r)));
        };
        per_replica("peregrine_router:requests_total", "counter", "Requests sent to each replica.",
                    [](const ReplicaState& r) { return r.requests; });
        per_replica("peregrine_router:errors_total", "counter", "Requests that failed at each replica.",
                    [](const ReplicaState& r) { return r.errors; });
        per_replica("peregrine_router:in_flight", "gauge", "Requests outstanding at each replica.",
                    [](const ReplicaState& r) { return r.outstanding; });
        per_replica("peregrine_router:prefilling", "gauge",
                    "Requests at each replica whose first token has not come back (streams; whole answers until "
                    "they end).",
                    [](const ReplicaState& r) { return r.prefilling; });
        per_replica("peregrine_router:queued_prefill_chars", "gauge",
                    "Their prompt characters the replica's prefix index does not hold: the prefill queued there.",
                    [](const ReplicaState& r) { return r.queued_chars; });
        per_replica("peregrine_router:healthy", "gauge", "1 when the replica takes requests, 0 when ejected.",
                    [](const ReplicaState& r) { return r.healthy ? 1 : 0; });
        per_replica("peregrine_router:prefix_index_replica_keys", "gauge",
                    "Prompt-prefix keys the cache-aware index holds for each replica.",
                    [](const ReplicaState& r) { return r.index_keys; });
        per_replica("peregrine_router:prefix_index_capacity_keys", "gauge",
                    "Keys the index keeps for each replica: its KV pool x prompt characters per token / 64 once "
                    "its /metrics tell, else 65536.",
                    [](const ReplicaState& r) { return r.index_capacity; });
        w.header("peregrine_router:routing_decisions_total", "counter", "Routing decisions by reason.");
        for (const auto& [reason, n] : router.decisions())
            w.sample("peregrine_router:routing_decisions_total", "reason=\"" + reason + "\"", static_cast<double>(n));
        w.header("peregrine_router:prefix_index_keys", "gauge", "Prompt-prefix keys the cache-aware index holds.");
        w.sample("peregrine_router:prefix_index_keys", "", static_cast<double>(router.prefix_index_size()));
        std::lock_guard lock(metrics_mu);
        w.header("peregrine_router:retries_total", "counter", "Requests retried on another replica.");
        w.sample("peregrine_router:retries_total", "", static_cast<double>(retries));
        w.header("peregrine_router:midstream_failures_total", "counter",
                 "Responses that failed after their first byte went to the client.");
        w.sample("peregrine_router:midstream_failures_total", "", static_cast<double>(midstream_failures));
        w.header("peregrine_router:request_latency_seconds", "histogram",
                 "Time from sending a request to a replica to the end of its response.");
        for (const auto& [url, h] : latency)
            w.histogram("peregrine_router:request_latency_seconds", "backend=\"" + server::escape_label(url) + "\"", h);
        return w.text();
    }
};

RouterService::RouterService(RouterOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

RouterService::~RouterService() {
    stop();
}

void RouterService::start() {
    Impl& m = *impl_;
    const int threads = m.options.client_threads > 0 ? m.options.client_threads : 2;
    for (int i = 0; i < threads; ++i) m.threads.emplace_back([&m] { m.ioc.run(); });
    // The first round before any request: no traffic to a replica that was never seen healthy.
    Clock::time_point next_dns = Clock::now();
    m.check_once(next_dns);
    m.checker = std::thread([&m, next_dns] { m.check_loop(next_dns); });
}

void RouterService::stop() {
    Impl& m = *impl_;
    {
        std::lock_guard lock(m.stop_mu);
        if (m.stopping) return;
        m.stopping = true;
    }
    m.stop_cv.notify_all();
    if (m.checker.joinable()) m.checker.join();
    m.work.reset();
    m.ioc.stop();
    for (std::thread& t : m.threads) t.join();
}

void RouterService::begin_drain() {
    impl_->draining = true;
}

int64_t RouterService::in_flight() const {
    return impl_->in_flight.load();
}

bool RouterService::health_ok(const std::string& url, double timeout_s) {
    return Impl::health_ok(url, timeout_s);
}

int RouterService::healthy_replicas() const {
    int n = 0;
    for (const ReplicaState& r : impl_->router.snapshot()) n += r.healthy ? 1 : 0;
    return n;
}

void RouterService::handle(const server::HttpRequest& req, std::shared_ptr<server::Exchange> ex) {
    Impl& m = *impl_;
    if (req.path == "/health") {
        int healthy = 0;
        for (const ReplicaState& r : m.router.snapshot()) healthy += r.healthy ? 1 : 0;
        const bool ok = healthy > 0 && !m.draining;
        json h{{"status", m.draining ? "draining"
                          : ok       ? "ok"
                                     : "no healthy replica"},
               {"healthy_replicas", healthy},
               {"policy", policy_name(m.router.policy())}};
        if (!m.options.model_name.empty()) h["model"] = m.options.model_name;
        ex->respond(ok ? 200 : 503, h.dump());
        return;
    }
    if (req.path == "/metrics") {
        ex->respond(200, m.metrics_text(), "text/plain; version=0.0.4");
        return;
    }
    if (!server::bearer_key_accepted(req.header("authorization"), m.options.api_keys)) {
        ex->respond(401, error_json("Invalid or missing API key", "authentication_error"));
        return;
    }
    if (m.draining) {
        ex->respond(503, error_json("the router is shutting down"));
        return;
    }
    if (req.websocket_upgrade) {
        // The whole connection goes to one replica (its requests are multiplexed on it).
        const Decision d = m.router.pick("", "");
        if (d.replica < 0) {
            ex->respond(503, error_json("no healthy replica to serve the request"));
            return;
        }
        ++m.in_flight;
        auto strand = asio::make_strand(m.ioc);
        const std::string authorization(req.header("authorization"));
        ex->accept_websocket([&m, d, strand, authorization](std::shared_ptr<server::WebSocket> ws) {
            auto bridge = std::make_shared<WsBridge>(strand, ws);
            auto done = [&m, d](bool failed) {
                m.router.finish(d, failed);
                if (failed) m.router.set_healthy(d.id, false);
                --m.in_flight;
            };
            asio::co_spawn(strand, bridge->run(parse_backend(d.url), authorization, done), asio::detached);
            server::WebSocketCallbacks cb;
            cb.on_message = [bridge](std::string text) { bridge->to_upstream(std::move(text)); };
            cb.on_close = [bridge] { bridge->client_closed(); };
            return cb;
        });
        return;
    }
    auto job = std::make_shared<Impl::Job>();
    job->exec = ex->executor();
    job->on_exchange_strand = static_cast<bool>(job->exec);
    if (!job->on_exchange_strand) job->exec = asio::make_strand(m.ioc);
    job->method = req.method;
    job->path = req.path;
    job->body = req.body;
    job->content_type = std::string(req.header("content-type"));
    job->authorization = std::string(req.header("authorization"));
    job->request_id = req.request_id;
    job->session_header = std::string(req.header("x-session-id"));
    job->ex = ex;
    prompt_facts(req.path, req.body, job->session_header, job->text, job->session);
    ex->on_client_gone([gone = job->gone, cancel = job->cancel, mu = job->cancel_mu, exec = job->exec] {
        gone->store(true);
        asio::post(exec, [cancel, mu] {
            std::lock_guard lock(*mu);
            if (*cancel) (*cancel)();
        });
    });
    ++m.in_flight;
    asio::co_spawn(job->exec, m.forward(job), asio::detached);
}

}  // namespace peregrine::router
