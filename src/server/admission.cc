#include "server/admission.h"

#include <cctype>

#include "core/error.h"
#include "server/api_error.h"

namespace peregrine::server {

namespace {

bool constant_time_equal(std::string_view a, std::string_view b) {
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
    return diff == 0 && !b.empty();
}

}  // namespace

Ticket& Ticket::operator=(Ticket&& o) noexcept {
    if (this != &o) {
        release();
        owner_ = o.owner_;
        cost_ = o.cost_;
        o.owner_ = nullptr;
    }
    return *this;
}

void Ticket::release() {
    if (!owner_) return;
    owner_->release(cost_);
    owner_ = nullptr;
}

Admission::Admission(AdmissionLimits limits, RateLimitOptions rates, std::vector<std::string> api_keys)
    : limits_(limits), api_keys_(std::move(api_keys)), limiter_(rates) {}

bool bearer_key_accepted(std::string_view auth, const std::vector<std::string>& keys) {
    if (keys.empty()) return true;
    constexpr std::string_view kBearer = "bearer ";
    if (auth.size() <= kBearer.size()) return false;
    for (size_t i = 0; i < kBearer.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(auth[i])) != kBearer[i]) return false;
    std::string_view key = auth.substr(kBearer.size());
    while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
    bool ok = false;
    for (const std::string& k : keys) ok |= constant_time_equal(key, k);
    return ok;
}

void Admission::check_caller(const Caller& caller, bool ready, bool draining) const {
    if (!authorized(caller.authorization))
        throw ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key");
    if (!ready) throw ApiError(503, "the model is still loading", "", "model_loading").with_retry_after(1);
    if (draining) throw ApiError(503, "the server is shutting down", "", "shutting_down");
}

void Admission::check_shape(int n, size_t num_prompts) const {
    if (limits_.max_n > 0 && n > limits_.max_n)
        bad_param("n", "'n' must be at most ", limits_.max_n, " on this server (--max-n), got ", n);
    if (limits_.max_prompts > 0 && num_prompts > static_cast<size_t>(limits_.max_prompts))
        bad_param("prompt", "'prompt' holds ", num_prompts, " prompts; this server takes at most ", limits_.max_prompts,
                  " in one request (--max-prompts)");
}

Ticket Admission::admit(const Caller& caller, const RequestCost& cost) {
    const AdmissionLimits& l = limits_;
    if (l.max_queued_sequences > 0 && cost.sequences > l.max_queued_sequences)
        bad_param("n", "the request asks for ", cost.sequences, " sequences (prompts x n); this server holds at most ",
                  l.max_queued_sequences, " in flight (--max-queued-sequences)");
    if (l.max_queued_tokens > 0 && cost.tokens > l.max_queued_tokens)
        bad_param("max_tokens", "the request may need ", cost.tokens,
                  " tokens (prompts + n x max_tokens); this server holds at most ", l.max_queued_tokens,
                  " in flight (--max-queued-tokens)");
    // Reserve first, then check: concurrent admissions never overshoot a limit together.
    const int64_t reqs = requests_.fetch_add(1) + 1;
    const int64_t seqs = sequences_.fetch_add(cost.sequences) + cost.sequences;
    const int64_t toks = tokens_.fetch_add(cost.tokens) + cost.tokens;
    Ticket ticket(this, cost);
    // 429 when `total` in flight (this request's `adds` included) passes `limit`.
    auto full = [](int64_t limit, int64_t total, int64_t adds, const char* what, const char* code) {
        if (limit <= 0 || total <= limit) return;
        throw ApiError(429,
                       str_cat("The server has ", total - adds, " ", what, " in flight and this request adds ", adds,
                               ", over its maximum of ", limit, "; retry shortly"),
                       "", code)
            .with_retry_after(1);
    };
    full(l.max_queued_requests, reqs, 1, "requests", "too_many_requests_queued");
    full(l.max_queued_sequences, seqs, cost.sequences, "sequences", "too_many_sequences_queued");
    full(l.max_queued_tokens, toks, cost.tokens, "tokens", "too_many_tokens_queued");
    check_rate(caller, cost.tokens);
    return ticket;
}

void Admission::charge(const Caller& caller) {
    check_rate(caller, 0);
}

// The client's rate-limit key: its API key when the server has keys, else its address.
void Admission::check_rate(const Caller& caller, int64_t tokens) {
    if (!limiter_.enabled()) return;
    std::string key;
    if (!api_keys_.empty()) {
        key = std::string(caller.authorization);
    } else {
        key = std::string(caller.remote);
        if (const size_t colon = key.rfind(':'); colon != std::string::npos) key.resize(colon);
    }
    const RateLimiter::Decision d = limiter_.admit(key, tokens);
    if (d.admitted) return;
    if (d.never)  // retrying cannot help
        throw ApiError(
            413,
            str_cat("this request needs ", tokens, " tokens (prompt + max_tokens x n), more than the limit of ",
                    limiter_.options().tokens_per_minute, " tokens per minute; lower max_tokens, n or the prompt"),
            "max_tokens", "tokens_exceed_rate_limit");
    throw ApiError(429, str_cat("rate limit reached; retry after ", d.retry_after_s, " s"), "", "rate_limit_exceeded")
        .with_retry_after(d.retry_after_s);
}

void Admission::release(const RequestCost& cost) {
    requests_.fetch_sub(1);
    sequences_.fetch_sub(cost.sequences);
    tokens_.fetch_sub(cost.tokens);
}

}  // namespace peregrine::server
