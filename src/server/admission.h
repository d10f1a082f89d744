// Admission: the one gate every transport (HTTP, WebSocket, gRPC) passes a request through
// before it may reach the engine. It answers, in this order: may this caller ask at all (API
// key; the model loaded; not draining), is the request's shape within the per-request limits
// (n, prompts), is there room for what it will hold while it runs (requests, sequences and
// tokens in flight), and may this caller spend that much now (rate limits). What it admits is
// held by a Ticket until the request ends, so the in-flight totals can never drift.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/rate_limit.h"

namespace peregrine::server {

struct AdmissionLimits {
    int max_n = 128;                      // choices a request may ask for (n)
    int max_prompts = 1024;               // prompts of one /v1/completions request
    int64_t max_queued_requests = 0;      // completion requests in flight; 0 = no limit
    int64_t max_queued_sequences = 4096;  // sequences (prompts x n) in flight; 0 = no limit
    int64_t max_queued_tokens = 0;        // tokens (prompts + n x max_tokens) in flight; 0 = no limit
};

// Who asks, over what. The same for every transport.
struct Caller {
    std::string_view transport;      // "http", "ws", "grpc"
    std::string_view authorization;  // the Authorization header (metadata on gRPC), "" when absent
    std::string_view remote;         // "ip:port"
};

// What a completion request holds while it runs.
struct RequestCost {
    int64_t sequences = 0;  // prompts x n
    int64_t tokens = 0;     // each prompt once plus, for each of its n choices, the most it may generate
};

// Whether an Authorization header carries one of `keys` ("Bearer <key>", scheme in any case,
// keys compared in constant time); any header passes when `keys` is empty.
bool bearer_key_accepted(std::string_view authorization, const std::vector<std::string>& keys);

class Admission;

// The in-flight share of one admitted request; released (once) when destroyed or on release().
class Ticket {
  public:
    Ticket() = default;
    Ticket(Admission* owner, RequestCost cost) : owner_(owner), cost_(cost) {}
    Ticket(Ticket&& o) noexcept : owner_(o.owner_), cost_(o.cost_) { o.owner_ = nullptr; }
    Ticket& operator=(Ticket&& o) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { release(); }
    void release();

  private:
    Admission* owner_ = nullptr;
    RequestCost cost_;
};

class Admission {
  public:
    Admission(AdmissionLimits limits, RateLimitOptions rates, std::vector<std::string> api_keys);

    const AdmissionLimits& limits() const { return limits_; }
    const RateLimitOptions& rates() const { return limiter_.options(); }

    // Whether an Authorization value ("Bearer KEY") is accepted (always, without keys).
    bool authorized(std::string_view authorization) const { return bearer_key_accepted(authorization, api_keys_); }
    // ApiError 401 (bad key) or 503 (loading, draining) when the caller may not go on.
    void check_caller(const Caller& caller, bool ready, bool draining) const;
    // ApiError 400 when n or the number of prompts is over its limit.
    void check_shape(int n, size_t num_prompts) const;
    // Room in flight (429 with Retry-After when full now, 400 when the request can never fit),
    // then the caller's rate limits (429; 413 when its tokens exceed a whole minute's allowance).
    // Nothing is taken unless everything admits it.
    Ticket admit(const Caller& caller, const RequestCost& cost);
    // The rate limit of a request that holds nothing in flight (tokenize, models): one request.
    void charge(const Caller& caller);

    int64_t requests_in_flight() const { return requests_.load(std::memory_order_relaxed); }
    int64_t sequences_in_flight() const { return sequences_.load(std::memory_order_relaxed); }
    int64_t tokens_in_flight() const { return tokens_.load(std::memory_order_relaxed); }

  private:
    friend class Ticket;
    void release(const RequestCost& cost);
    void check_rate(const Caller& caller, int64_t tokens);

    const AdmissionLimits limits_;
    const std::vector<std::string> api_keys_;
    RateLimiter limiter_;
    std::atomic<int64_t> requests_{0}, sequences_{0}, tokens_{0};
};

}  // namespace peregrine::server
