// What the connections of one HTTP server share (internal to src/server/http): the open
// connection count, the request-body bytes being held, and the WebSockets to close on shutdown.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace peregrine::server {

class WsSession;

// What every connection of one server shares: the open-connection count (each connection holds
// a Slot from accept to close, handed on to its WebSocket after an upgrade) and the WebSockets
// that close_websockets() reaches.
struct Connections {
    std::atomic<int> open{0};
    std::atomic<int64_t> body_bytes{0};  // reserved by requests being received or handled
    std::atomic<int64_t> since_trim{0};  // bytes reserved since the heap was last trimmed
    std::mutex mu;
    std::vector<std::weak_ptr<WsSession>> websockets;  // pruned as they close (websocket_session.cc)

    // Reserves `n` body bytes unless that would pass `limit`.
    bool reserve_body(int64_t n, int64_t limit) {
        int64_t cur = body_bytes.load();
        do {
            if (cur + n > limit && n > 0) return false;
        } while (!body_bytes.compare_exchange_weak(cur, cur + n));
        since_trim.fetch_add(n);
        return true;
    }
    // After a burst of large bodies, give the freed heap back to the system once the last of
    // them is handled (glibc keeps it otherwise: 790 MB stayed resident after 16 x 30 MiB).
    void release_body(int64_t n);

    // Sends every open WebSocket a Close frame 1001 "going away" (websocket_session.cc).
    void close_websockets();

    class Slot {
      public:
        explicit Slot(Connections* c) : c_(c) { c_->open.fetch_add(1); }
        Slot(Slot&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
        Slot(const Slot&) = delete;
        Slot& operator=(const Slot&) = delete;
        ~Slot() {
            if (c_) c_->open.fetch_sub(1);
        }
        Connections* owner() const { return c_; }

      private:
        Connections* c_;
    };
};

// A new X-Request-Id: "req-" and 16 hex digits (a per-thread salt and a counter).
std::string new_request_id();

// The OpenAI error body for what the HTTP layer refuses itself (type from the status, as ApiError).
std::string error_json(int status, const char* message, const char* code);

}  // namespace peregrine::server
