// Blocking TCP helpers shared by the rendezvous store and the control channel (IPv4, CLOEXEC
// sockets, TCP_NODELAY on connections: both carry small latency-bound messages).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace peregrine {

// Little-endian u32 fields of the wire formats.
void put_u32(std::string& out, uint32_t v);
uint32_t get_u32(const std::string& in, size_t at);

std::string errno_text(int err);
std::string seconds_text(std::chrono::milliseconds ms);

// A listening socket on every interface at `port` (0: an ephemeral one); `bound_port` gets the
// port. Throws Error starting with `what`; `in_use_hint` is appended when the port is taken.
int listen_tcp(int port, int& bound_port, const std::string& what, const std::string& in_use_hint = "");

// A port no one listens on now (the kernel's next ephemeral one), for a child process to bind;
// another process taking it first is a clear "address in use" error there.
int pick_free_port(const std::string& what);

// Connects to host:port, retrying every 100 ms (ranks start in any order, DNS of a new pod may
// lag) for up to `timeout`. Throws naming `what`, the address and the last error.
int connect_with_retry(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& what);

// The whole buffer, or false when the peer is gone. Never raises SIGPIPE.
bool send_all(int fd, const void* data, size_t size);
inline bool send_all(int fd, const std::string& data) {
    return send_all(fd, data.data(), data.size());
}
// Exactly `size` bytes, or false at end of stream or on an error.
bool recv_exact(int fd, void* data, size_t size);

}  // namespace peregrine
