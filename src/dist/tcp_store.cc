#include "dist/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/socket_io.h"

namespace peregrine {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Frame ops (one byte on the wire).
constexpr char kHello = 'H';  // a = rank, b = world size (decimal)
constexpr char kSet = 'S';    // a = key, b = value
constexpr char kGet = 'G';    // a = key, b = timeout in ms (decimal)
constexpr char kBye = 'B';    // a clean close follows
constexpr char kOk = 'O';     // b = value (GET) or empty
constexpr char kErr = 'E';    // b = message

// A frame's field longer than this is a protocol error (not a peer of ours), not an allocation.
constexpr uint32_t kMaxField = 64u << 20;

std::string frame(char op, const std::string& a, const std::string& b) {
    std::string out;
    out.reserve(9 + a.size() + b.size());
    out.push_back(op);
    put_u32(out, static_cast<uint32_t>(a.size()));
    out += a;
    put_u32(out, static_cast<uint32_t>(b.size()));
    out += b;
    return out;
}

enum class Parse { kFrame, kNeedMore, kBad };

// Takes one whole frame off the front of `buf` when there is one.
Parse take_frame(std::string& buf, char& op, std::string& a, std::string& b) {
    if (buf.size() < 5) return Parse::kNeedMore;
    const uint32_t na = get_u32(buf, 1);
    if (na > kMaxField) return Parse::kBad;
    if (buf.size() < 5 + size_t{na} + 4) return Parse::kNeedMore;
    const uint32_t nb = get_u32(buf, 5 + na);
    if (nb > kMaxField) return Parse::kBad;
    const size_t total = 5 + size_t{na} + 4 + nb;
    if (buf.size() < total) return Parse::kNeedMore;
    op = buf[0];
    a.assign(buf, 5, na);
    b.assign(buf, 9 + na, nb);
    buf.erase(0, total);
    return Parse::kFrame;
}

int parse_decimal(const std::string& s) {
    try {
        size_t used = 0;
        const int v = std::stoi(s, &used);
        return used == s.size() ? v : -1;
    } catch (const std::exception&) {
        return -1;
    }
}

}  // namespace

// Rank 0's side: one thread polling the listening socket, every rank's connection and a wake-up
// pipe (the destructor's stop signal). It owns the map; nothing else touches it, so only
// failure_ (read by TcpStore::failure on another thread) needs the mutex.
class TcpStoreServer {
  public:
    TcpStoreServer(int port, int world_size) : world_size_(world_size), connected_(world_size, false) {
        listen_fd_ = listen_tcp(port, port_, "rendezvous store",
                                " (another group's rank 0 on this host? choose another --master-port)");
        if (::pipe2(wake_, O_CLOEXEC) != 0) {
            const int err = errno;
            ::close(listen_fd_);
            fail("rendezvous store: pipe(): ", errno_text(err));
        }
        thread_ = std::thread([this] { run(); });
    }

    ~TcpStoreServer() {
        const char stop = 1;
        (void)!::write(wake_[1], &stop, 1);
        thread_.join();
        for (Conn& c : conns_) ::close(c.fd);
        ::close(listen_fd_);
        ::close(wake_[0]);
        ::close(wake_[1]);
    }

    int port() const { return port_; }

    std::string failure() const {
        std::lock_guard<std::mutex> lock(mu_);
        return failure_;
    }

  private:
    struct Conn {
        int fd = -1;
        int rank = -1;     // -1 until its HELLO
        std::string in;    // bytes received, not yet a whole frame
        bool bye = false;  // said BYE: its close is not a failure
        bool drop = false;
    };
    struct Waiter {
        int fd;  // the waiting connection
        std::string key;
        Clock::time_point deadline;
        milliseconds timeout;
    };

    void run() {
        for (;;) {
            std::vector<pollfd> fds;
            fds.push_back({wake_[0], POLLIN, 0});
            fds.push_back({listen_fd_, POLLIN, 0});
            for (const Conn& c : conns_) fds.push_back({c.fd, POLLIN, 0});
            int wait_ms = -1;
            const Clock::time_point now = Clock::now();
            for (const Waiter& w : waiters_) {
                const auto left = std::chrono::ceil<milliseconds>(w.deadline - now).count();
                const int ms = static_cast<int>(std::max<int64_t>(0, left));
                wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
            }
            if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) return;
            if (fds[0].revents) return;  // stop
            if (fds[1].revents & POLLIN) {
                const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
                if (fd >= 0) {
                    const int one = 1;
                    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    Conn c;
                    c.fd = fd;
                    conns_.push_back(std::move(c));
                }
            }
            // conns_ may have grown by the accept: only the first fds.size() - 2 were polled.
            for (size_t i = 0; i + 2 < fds.size(); ++i) {
                if (fds[i + 2].revents) read_from(conns_[i]);
            }
            for (size_t i = 0; i < conns_.size();) {
                if (conns_[i].drop) {
                    drop(conns_[i]);
                    conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
                } else {
                    ++i;
                }
            }
            expire_waiters();
        }
    }

    void read_from(Conn& c) {
        char buf[4096];
        const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) return;
        if (n <= 0) {
            c.drop = true;
            return;
        }
        c.in.append(buf, static_cast<size_t>(n));
        char op = 0;
        std::string a, b;
        for (;;) {
            const Parse p = take_frame(c.in, op, a, b);
            if (p == Parse::kNeedMore) return;
            if (p == Parse::kBad) {
                c.drop = true;
                return;
            }
            handle(c, op, a, b);
            if (c.drop) return;
        }
    }

    void handle(Conn& c, char op, const std::string& a, const std::string& b) {
        if (op != kHello && c.rank < 0) {
            reply_err(c, "the first message must be HELLO");
            return;
        }
        switch (op) {
            case kHello: {
                const int rank = parse_decimal(a), world = parse_decimal(b);
                if (world != world_size_) {
                    reply_err(c, str_cat("rank ", a, " expects a world of ", b, " ranks, rank 0 one of ", world_size_));
                } else if (rank < 0 || rank >= world_size_) {
                    reply_err(c, str_cat("rank ", a, " is not in [0, ", world_size_, ")"));
                } else if (connected_[rank]) {
                    reply_err(c, str_cat("rank ", rank, " connected twice (two processes were given the same rank)"));
                } else {
                    c.rank = rank;
                    connected_[rank] = true;
                    send_all(c.fd, frame(kOk, "", ""));
                }
                return;
            }
            case kSet: {
                kv_[a] = b;
                send_all(c.fd, frame(kOk, "", ""));
                for (size_t i = 0; i < waiters_.size();) {
                    if (waiters_[i].key == a) {
                        send_all(waiters_[i].fd, frame(kOk, "", b));
                        waiters_.erase(waiters_.begin() + static_cast<std::ptrdiff_t>(i));
                    } else {
                        ++i;
                    }
                }
                return;
            }
            case kGet: {
                const auto it = kv_.find(a);
                const std::string failed = failure();
                if (it != kv_.end()) {
                    send_all(c.fd, frame(kOk, "", it->second));
                } else if (!failed.empty()) {
                    send_all(c.fd, frame(kErr, "", failed));
                } else {
                    const milliseconds timeout(std::max(0, parse_decimal(b)));
                    waiters_.push_back(Waiter{c.fd, a, Clock::now() + timeout, timeout});
                }
                return;
            }
            case kBye:
                c.bye = true;
                return;
            default:
                c.drop = true;  // not our protocol
                return;
        }
    }

    void reply_err(Conn& c, const std::string& message) {
        send_all(c.fd, frame(kErr, "", message));
        c.drop = true;
    }

    // A connection is gone: forget its waits; if it was a rank that had not said BYE, every wait
    // (now and later) fails naming it.
    void drop(Conn& c) {
        ::close(c.fd);
        std::erase_if(waiters_, [&](const Waiter& w) { return w.fd == c.fd; });
        if (c.bye || c.rank < 0) return;
        std::string message;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (!failure_.empty()) return;
            failure_ = str_cat("rank ", c.rank,
                               " disconnected from the rendezvous store without a goodbye (it exited or crashed)");
            message = failure_;
        }
        for (const Waiter& w : waiters_) send_all(w.fd, frame(kErr, "", message));
        waiters_.clear();
    }

    void expire_waiters() {
        const Clock::time_point now = Clock::now();
        for (size_t i = 0; i < waiters_.size();) {
            const Waiter& w = waiters_[i];
            if (w.deadline > now) {
                ++i;
                continue;
            }
            std::string missing;
            for (int r = 0; r < world_size_; ++r)
                if (!connected_[r]) missing += str_cat(missing.empty() ? "" : ", ", r);
            const std::string message =
                str_cat("timed out after ", seconds_text(w.timeout), " waiting for key '", w.key, "'",
                        missing.empty() ? "; every rank connected but none set it"
                                        : str_cat("; ranks that never connected: ", missing));
            send_all(w.fd, frame(kErr, "", message));
            waiters_.erase(waiters_.begin() + static_cast<std::ptrdiff_t>(i));
        }
    }

    const int world_size_;
    int listen_fd_ = -1;
    int port_ = 0;
    int wake_[2] = {-1, -1};  // [read end polled by run(), write end poked by the destructor]
    std::thread thread_;
    std::vector<Conn> conns_;
    std::vector<bool> connected_;  // [world_size]: said HELLO at some point
    std::map<std::string, std::string> kv_;
    std::vector<Waiter> waiters_;
    mutable std::mutex mu_;
    std::string failure_;  // guarded by mu_
};

TcpStore::TcpStore(const Options& options) : options_(options) {
    if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
        fail("rendezvous store: rank ", options_.rank, " is not in [0, ", options_.world_size, ")");
    if (options_.master_port < 0 || options_.master_port > 65535 || (options_.rank > 0 && options_.master_port == 0))
        fail("rendezvous store: ", options_.master_port, " is not a TCP port");
    std::string host = options_.master_addr;
    port_ = options_.master_port;
    if (options_.rank == 0) {
        server_ = std::make_unique<TcpStoreServer>(options_.master_port, options_.world_size);
        port_ = server_->port();
        host = "127.0.0.1";  // the server listens on every interface; loopback always reaches it
    }
    fd_ = connect_with_retry(host, port_, options_.timeout, "rank 0's rendezvous store");
    try {
        request(kHello, std::to_string(options_.rank), std::to_string(options_.world_size), options_.timeout);
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

TcpStore::~TcpStore() {
    send_all(fd_, frame(kBye, "", ""));
    ::close(fd_);
    server_.reset();
}

std::string TcpStore::request(char op, const std::string& a, const std::string& b, milliseconds wait) {
    const std::string where = str_cat(options_.master_addr, ":", port_);
    const std::string lost = str_cat("rank ", options_.rank, " lost its connection to rank 0's rendezvous store at ",
                                     where, " (rank 0 exited or closed the store)");
    if (!send_all(fd_, frame(op, a, b))) fail(lost);
    const Clock::time_point deadline = Clock::now() + wait;
    std::string in;
    for (;;) {
        char rop = 0;
        std::string ra, rb;
        const Parse p = take_frame(in, rop, ra, rb);
        if (p == Parse::kFrame) {
            if (rop == kOk) return rb;
            if (rop == kErr) fail("rank ", options_.rank, ": rendezvous store: ", rb);
            fail("rendezvous store at ", where, " sent an unknown reply");
        }
        if (p == Parse::kBad) fail("rendezvous store at ", where, " sent a malformed reply");
        const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
        if (left <= 0)
            fail("rank ", options_.rank, ": no answer from rank 0's rendezvous store at ", where, " within ",
                 seconds_text(wait));
        pollfd pfd{fd_, POLLIN, 0};
        const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
        if (ready < 0 && errno != EINTR) fail(lost, ": ", errno_text(errno));
        if (ready <= 0) continue;
        char buf[4096];
        const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail(lost);
        in.append(buf, static_cast<size_t>(n));
    }
}

void TcpStore::set(const std::string& key, const std::string& value) {
    request(kSet, key, value, options_.timeout);
}

std::string TcpStore::get(const std::string& key) {
    // The server answers a timeout itself (naming missing ranks); the extra margin only catches
    // a server that stopped answering.
    return request(kGet, key, std::to_string(options_.timeout.count()), options_.timeout + std::chrono::seconds(10));
}

void TcpStore::check_fingerprint(const std::string& fingerprint) {
    // Keys carry a per-call generation so the check can run more than once (each rank calls it
    // the same number of times).
    const std::string prefix = str_cat("fingerprint/", fingerprint_generation_++, "/");
    set(prefix + std::to_string(options_.rank), fingerprint);
    const std::string reference = get(prefix + "0");
    // Every rank reads every value and reports the same first difference, so all fail alike.
    for (int r = 1; r < options_.world_size; ++r) {
        const std::string theirs = r == options_.rank ? fingerprint : get(prefix + std::to_string(r));
        if (theirs != reference)
            fail("rank ", r, " loaded a different model or options than rank 0: rank ", r, " has '", theirs,
                 "', rank 0 has '", reference, "'");
    }
}

std::string TcpStore::failure() const {
    return server_ ? server_->failure() : std::string();
}

}  // namespace peregrine
