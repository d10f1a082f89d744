#include "dist/control_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "dist/socket_io.h"
#include "dist/tcp_store.h"

namespace peregrine {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A message longer than this is a corrupt stream, not a batch (a batch of 2^20 tokens is ~20 MB).
constexpr uint32_t kMaxMessage = 1u << 30;

}  // namespace

ControlLeader::ControlLeader(TcpStore& store, milliseconds timeout) : fds_(store.world_size(), -1) {
    PG_CHECK(store.rank() == 0, "ControlLeader: rank 0 only");
    int port = 0;
    const int listen_fd = listen_tcp(0, port, "control channel");
    store.set("control/port", std::to_string(port));
    const Clock::time_point deadline = Clock::now() + timeout;
    int missing = store.world_size() - 1;
    try {
        while (missing > 0) {
            const std::string failed = store.failure();
            if (!failed.empty()) fail("while the group connected: ", failed);
            if (Clock::now() >= deadline) {
                std::string who;
                for (int r = 1; r < store.world_size(); ++r)
                    if (fds_[r] < 0) who += (who.empty() ? "" : ", ") + std::to_string(r);
                fail("rank(s) ", who, " did not connect to rank 0's control channel within ", seconds_text(timeout));
            }
            pollfd pfd{listen_fd, POLLIN, 0};
            if (::poll(&pfd, 1, 100) <= 0) continue;
            const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) continue;
            std::string hello(4, '\0');
            const int rank = recv_exact(fd, hello.data(), 4) ? static_cast<int>(get_u32(hello, 0)) : -1;
            if (rank < 1 || rank >= store.world_size() || fds_[rank] >= 0) {  // not one of ours: drop it
                ::close(fd);
                continue;
            }
            fds_[rank] = fd;
            --missing;
        }
    } catch (...) {
        ::close(listen_fd);
        for (int fd : fds_)
            if (fd >= 0) ::close(fd);
        throw;
    }
    ::close(listen_fd);
}

ControlLeader::~ControlLeader() {
    for (int fd : fds_)
        if (fd >= 0) ::close(fd);
}

void ControlLeader::send(const std::string& message) {
    std::string head;
    put_u32(head, static_cast<uint32_t>(message.size()));
    for (size_t r = 1; r < fds_.size(); ++r)
        if (!send_all(fds_[r], head) || !send_all(fds_[r], message))
            fail("rank ", r, " closed its control connection (it exited or crashed)");
}

int ControlLeader::closed_rank() const {
    for (size_t r = 1; r < fds_.size(); ++r) {
        pollfd pfd{fds_[r], POLLIN | POLLRDHUP, 0};
        if (::poll(&pfd, 1, 0) > 0) return static_cast<int>(r);
    }
    return -1;
}

ControlFollower::ControlFollower(TcpStore& store, const std::string& master_addr, milliseconds timeout) {
    PG_CHECK(store.rank() > 0, "ControlFollower: ranks other than 0");
    const int port = std::stoi(store.get("control/port"));
    fd_ = connect_with_retry(master_addr, port, timeout, "rank 0's control channel");
    std::string hello;
    put_u32(hello, static_cast<uint32_t>(store.rank()));
    if (!send_all(fd_, hello)) {
        ::close(fd_);
        fail("rank ", store.rank(), ": rank 0's control channel closed at once");
    }
}

ControlFollower::~ControlFollower() {
    ::close(fd_);
}

bool ControlFollower::recv(std::string& message) {
    std::string head(4, '\0');
    if (!recv_exact(fd_, head.data(), 4)) return false;
    const uint32_t n = get_u32(head, 0);
    if (n > kMaxMessage) fail("control channel: a message of ", n, " bytes (corrupt stream)");
    message.resize(n);
    return recv_exact(fd_, message.data(), n);
}

}  // namespace peregrine
