#include "server/rate_limit.h"

#include <algorithm>
#include <cmath>

namespace peregrine::server {

namespace {

constexpr size_t kPruneAbove = 10000;  // keys kept before full (idle) buckets are forgotten

// Seconds until a bucket refilling `per_minute` holds `need` when it holds `have`.
double wait_s(double have, double need, int64_t per_minute) {
    if (have >= need) return 0;
    return (need - have) * 60.0 / static_cast<double>(per_minute);
}

}  // namespace

void RateLimiter::refill(Buckets& b, Clock::time_point now) const {
    const double dt = std::max(0.0, std::chrono::duration<double>(now - b.last).count());
    b.last = now;
    if (options_.requests_per_minute > 0)
        b.requests = std::min<double>(static_cast<double>(options_.requests_per_minute),
                                      b.requests + dt * static_cast<double>(options_.requests_per_minute) / 60.0);
    if (options_.tokens_per_minute > 0)
        b.tokens = std::min<double>(static_cast<double>(options_.tokens_per_minute),
                                    b.tokens + dt * static_cast<double>(options_.tokens_per_minute) / 60.0);
}

RateLimiter::Decision RateLimiter::admit(const std::string& key, int64_t tokens, Clock::time_point now) {
    Decision d;
    if (!enabled()) return d;
    const bool limit_tokens = options_.tokens_per_minute > 0 && tokens > 0;
    if (limit_tokens && tokens > options_.tokens_per_minute) {
        d.admitted = false;
        d.never = true;
        d.retry_after_s = 60;
        return d;
    }
    std::lock_guard lock(mu_);
    if (buckets_.size() > kPruneAbove) {
        for (auto it = buckets_.begin(); it != buckets_.end();) {
            refill(it->second, now);
            const bool full = (options_.requests_per_minute <= 0 ||
                               it->second.requests >= static_cast<double>(options_.requests_per_minute)) &&
                              (options_.tokens_per_minute <= 0 ||
                               it->second.tokens >= static_cast<double>(options_.tokens_per_minute));
            it = full ? buckets_.erase(it) : std::next(it);
        }
    }
    auto [it, fresh] = buckets_.try_emplace(key);
    Buckets& b = it->second;
    if (fresh) {
        b.requests = static_cast<double>(options_.requests_per_minute);
        b.tokens = static_cast<double>(options_.tokens_per_minute);
        b.last = now;
    }
    refill(b, now);
    double wait = 0;
    if (options_.requests_per_minute > 0) wait = std::max(wait, wait_s(b.requests, 1, options_.requests_per_minute));
    if (limit_tokens) wait = std::max(wait, wait_s(b.tokens, static_cast<double>(tokens), options_.tokens_per_minute));
    if (wait > 0) {
        d.admitted = false;
        d.retry_after_s = std::max(1, static_cast<int>(std::ceil(wait)));
        return d;
    }
    if (options_.requests_per_minute > 0) b.requests -= 1;
    if (limit_tokens) b.tokens -= static_cast<double>(tokens);
    return d;
}

}  // namespace peregrine::server
