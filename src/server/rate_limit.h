// Per-client rate limits: two token buckets per key (an API key, or the client address when the
// server has no keys), one for requests per minute and one for tokens per minute. Each bucket
// holds up to a minute's allowance and refills continuously. A request is admitted only when
// both buckets can pay for it; otherwise nothing is taken and the caller learns how long to wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace peregrine::server {

struct RateLimitOptions {
    int64_t requests_per_minute = 0;  // 0: unlimited
    int64_t tokens_per_minute = 0;    // 0: unlimited
};

class RateLimiter {
  public:
    using Clock = std::chrono::steady_clock;

    explicit RateLimiter(RateLimitOptions options) : options_(options) {}
    bool enabled() const { return options_.requests_per_minute > 0 || options_.tokens_per_minute > 0; }
    const RateLimitOptions& options() const { return options_; }

    struct Decision {
        bool admitted = true;
        int retry_after_s = 0;  // when refused: whole seconds until it would be admitted (at least 1)
        bool never = false;     // refused: the request costs more tokens than a full bucket holds
    };
    // Takes one request and `tokens` tokens from `key`'s buckets, or nothing when either is short.
    Decision admit(const std::string& key, int64_t tokens, Clock::time_point now = Clock::now());

  private:
    struct Buckets {
        double requests = 0;
        double tokens = 0;
        Clock::time_point last;
    };
    void refill(Buckets& b, Clock::time_point now) const;

    RateLimitOptions options_;
    std::mutex mu_;
    std::unordered_map<std::string, Buckets> buckets_;
};

}  // namespace peregrine::server
