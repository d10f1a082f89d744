#include "dist/socket_io.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace peregrine {

using Clock = std::chrono::steady_clock;

void put_u32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t get_u32(const std::string& in, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
    return v;
}

std::string errno_text(int err) {
    return std::strerror(err);
}

std::string seconds_text(std::chrono::milliseconds ms) {
    return str_cat(static_cast<double>(ms.count()) / 1000.0, " s");
}

int listen_tcp(int port, int& bound_port, const std::string& what, const std::string& in_use_hint) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail(what, ": socket(): ", errno_text(errno));
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        const int err = errno;
        ::close(fd);
        fail(what, ": cannot listen on port ", port, ": ", errno_text(err), err == EADDRINUSE ? in_use_hint : "");
    }
    if (::listen(fd, 128) != 0) {
        const int err = errno;
        ::close(fd);
        fail(what, ": listen(): ", errno_text(err));
    }
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    bound_port = ntohs(addr.sin_port);
    return fd;
}

int pick_free_port(const std::string& what) {
    int port = 0;
    ::close(listen_tcp(0, port, what));
    return port;
}

int connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what) {
    const Clock::time_point deadline = Clock::now() + timeout;
    std::string last_error = "no attempt";
    for (;;) {
        addrinfo hints{};
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* found = nullptr;
        const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
        if (gai != 0) {
            last_error = str_cat("cannot resolve '", host, "': ", ::gai_strerror(gai));
        } else {
            for (addrinfo* ai = found; ai; ai = ai->ai_next) {
                const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
                if (fd < 0) {
                    last_error = errno_text(errno);
                    continue;
                }
                if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                    ::freeaddrinfo(found);
                    const int one = 1;
                    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    return fd;
                }
                last_error = errno_text(errno);
                ::close(fd);
            }
            ::freeaddrinfo(found);
        }
        if (Clock::now() >= deadline)
            fail("could not reach ", what, " at ", host, ":", port, " within ", seconds_text(timeout), " (", last_error,
                 "): is rank 0 running, and are --master-addr / --master-port right?");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

bool send_all(int fd, const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::send(fd, p + done, size - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<size_t>(n);
    }
    return true;
}

bool recv_exact(int fd, void* data, size_t size) {
    char* p = static_cast<char*>(data);
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::recv(fd, p + done, size - done, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<size_t>(n);
    }
    return true;
}

}  // namespace peregrine
