#include "server/http/http_server.h"

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <cstdio>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "core/error.h"
#include "server/http/connections.h"
#include "server/http/session.h"

namespace peregrine::server {

namespace beast = boost::beast;
namespace net = boost::asio;
using tcp = net::ip::tcp;

int default_max_connections() {
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 65536;
    const long reserve = 256;  // model files, gRPC, logs, the refusals themselves
    return static_cast<int>(std::clamp<long>(static_cast<long>(rl.rlim_cur) - reserve, 16, 1 << 20));
}

namespace {

// Over the connection cap: a 503 and the connection closed, without a Session. What the client
// already sent is read and dropped for up to a second after the answer (a close with unread
// data would reset the connection and could lose the answer).
struct Refusal : std::enable_shared_from_this<Refusal> {
    tcp::socket socket;
    net::steady_timer timer;
    std::array<char, 1024> sink;
    explicit Refusal(tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}

    void start(const std::string& response) {
        net::async_write(socket, net::buffer(response), [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->finish();
            beast::error_code ignored;
            self->socket.shutdown(tcp::socket::shutdown_send, ignored);
            self->timer.expires_after(std::chrono::seconds(1));
            self->timer.async_wait([self](beast::error_code) { self->finish(); });
            self->drain();
        });
    }
    void drain() {
        socket.async_read_some(net::buffer(sink), [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->finish();
            self->drain();
        });
    }
    void finish() {
        beast::error_code ignored;
        timer.cancel();
        socket.close(ignored);
    }
};

void refuse_connection(tcp::socket socket) {
    static const std::string kResponse = [] {
        const std::string body =
            error_json(503, "the server has too many open connections; retry shortly", "too_many_connections");
        return str_cat("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n",
                       "Connection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    }();
    std::make_shared<Refusal>(std::move(socket))->start(kResponse);
}

}  // namespace

// The TLS context of `o`, its files read now: fails naming the flag and OpenSSL's reason.
std::unique_ptr<net::ssl::context> tls_context(const TlsOptions& o) {
    auto ctx = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
    ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                     net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 |
                     net::ssl::context::single_dh_use);
    beast::error_code ec;
    ctx->use_certificate_chain_file(o.cert_file, ec);
    if (ec) fail("--ssl-certfile ", o.cert_file, ": ", ec.message());
    ctx->use_private_key_file(o.key_file, net::ssl::context::pem, ec);
    if (ec) fail("--ssl-keyfile ", o.key_file, ": ", ec.message());
    if (SSL_CTX_check_private_key(ctx->native_handle()) != 1)
        fail("--ssl-keyfile ", o.key_file, " does not match the certificate of --ssl-certfile ", o.cert_file);
    if (!o.ca_file.empty()) {
        ctx->load_verify_file(o.ca_file, ec);
        if (ec) fail("--ssl-ca-certs ", o.ca_file, ": ", ec.message());
    }
    if (o.cert_reqs == 1) ctx->set_verify_mode(net::ssl::verify_peer, ec);
    if (o.cert_reqs == 2) ctx->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert, ec);
    return ctx;
}

struct HttpServer::Impl {
    HttpServerOptions opts;
    HttpHandler handler;
    std::unique_ptr<net::ssl::context> tls;  // set when opts.tls is enabled
    Connections connections;                 // before ioc: sessions destroyed with ioc's handlers still reach it
    net::io_context ioc;
    tcp::acceptor acceptor{ioc};
    std::vector<std::thread> threads;
    int port = 0;

    Impl(HttpServerOptions o, HttpHandler h, int num_threads)
        : opts(std::move(o)), handler(std::move(h)), ioc(num_threads) {}

    void do_accept() {
        acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
            if (!acceptor.is_open()) return;
            if (!ec && connections.open.load() >= opts.max_connections) {
                if (tls) {  // a plain-text 503 means nothing to a TLS client: just close
                    beast::error_code ignored;
                    socket.close(ignored);
                } else {
                    refuse_connection(std::move(socket));
                }
            } else if (!ec) {
                beast::error_code ignored;
                socket.set_option(tcp::no_delay(true), ignored);
                if (tls)
                    start_tls_session(std::move(socket), *tls, opts, handler, Connections::Slot(&connections));
                else
                    start_session(std::move(socket), opts, handler, Connections::Slot(&connections));
            } else if (ec == net::error::no_descriptors) {
                std::fprintf(stderr, "server: accept: %s\n", ec.message().c_str());
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            do_accept();
        });
    }
};

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler) {
    int n = options.io_threads;
    if (n <= 0) n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 4);
    options.io_threads = n;
    if (options.max_connections <= 0) options.max_connections = default_max_connections();
    impl_ = std::make_unique<Impl>(std::move(options), std::move(handler), n);
    if (impl_->opts.tls.enabled()) impl_->tls = tls_context(impl_->opts.tls);
}

HttpServer::~HttpServer() {
    stop();
}

void HttpServer::start() {
    Impl& s = *impl_;
    beast::error_code ec;
    tcp::resolver resolver(s.ioc);
    auto results = resolver.resolve(s.opts.host, std::to_string(s.opts.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) fail("--host ", s.opts.host, ": ", ec ? ec.message() : "no address");
    const tcp::endpoint ep = results.begin()->endpoint();
    s.acceptor.open(ep.protocol(), ec);
    if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) s.acceptor.bind(ep, ec);
    if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) fail("cannot listen on ", s.opts.host, ":", s.opts.port, ": ", ec.message());
    s.port = s.acceptor.local_endpoint().port();
    s.do_accept();
    for (int i = 0; i < s.opts.io_threads; ++i) {
        s.threads.emplace_back([&s] {
            for (;;) {  // a handler that throws loses its connection, never the thread
                try {
                    s.ioc.run();
                    return;
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "server: I/O handler failed: %s\n", e.what());
                }
            }
        });
    }
}

void check_tls_files(const TlsOptions& tls) {
    (void)tls_context(tls);
}

int HttpServer::port() const {
    return impl_->port;
}

int HttpServer::num_connections() const {
    return impl_->connections.open.load();
}

void HttpServer::close_websockets() {
    impl_->connections.close_websockets();
}

void HttpServer::stop() {
    if (!impl_) return;
    Impl& s = *impl_;
    s.ioc.stop();
    for (auto& t : s.threads)
        if (t.joinable()) t.join();
    s.threads.clear();
    beast::error_code ec;
    s.acceptor.close(ec);
}

}  // namespace peregrine::server
