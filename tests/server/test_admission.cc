// The one admission path every transport shares: per-request limits, room in flight (with
// tickets that give it back), rate limits, and the status each refusal carries.
#include <gtest/gtest.h>

#include "server/admission.h"
#include "server/api_error.h"

namespace peregrine::server {
namespace {

const Caller kCaller{"http", "", "10.0.0.1:5000"};

// The status of what `f` throws (0: nothing thrown).
template <typename F>
int status_of(F&& f, std::string* code = nullptr) {
    try {
        f();
    } catch (const ApiError& e) {
        if (code) *code = e.code();
        return e.status();
    }
    return 0;
}

TEST(Admission, TicketsHoldAndReturnTheRoomInFlight) {
    AdmissionLimits l;
    l.max_queued_requests = 2;
    l.max_queued_sequences = 10;
    l.max_queued_tokens = 1000;
    Admission a(l, {}, {});
    Ticket t1 = a.admit(kCaller, {4, 300});
    Ticket t2 = a.admit(kCaller, {4, 300});
    EXPECT_EQ(a.requests_in_flight(), 2);
    EXPECT_EQ(a.sequences_in_flight(), 8);
    EXPECT_EQ(a.tokens_in_flight(), 600);
    std::string code;
    EXPECT_EQ(status_of([&] { a.admit(kCaller, {1, 1}); }, &code), 429);
    EXPECT_EQ(code, "too_many_requests_queued");
    t1.release();
    t1.release();  // once only
    EXPECT_EQ(a.requests_in_flight(), 1);
    EXPECT_EQ(status_of([&] { a.admit(kCaller, {7, 1}); }, &code), 429);  // 4 + 7 sequences
    EXPECT_EQ(code, "too_many_sequences_queued");
    EXPECT_EQ(status_of([&] { a.admit(kCaller, {1, 701}); }, &code), 429);  // 300 + 701 tokens
    EXPECT_EQ(code, "too_many_tokens_queued");
    EXPECT_EQ(a.requests_in_flight(), 1) << "a refusal must take nothing";
    EXPECT_EQ(a.sequences_in_flight(), 4);
    {
        Ticket t3 = a.admit(kCaller, {6, 700});
        Ticket moved = std::move(t3);
        EXPECT_EQ(a.sequences_in_flight(), 10);
    }
    EXPECT_EQ(a.sequences_in_flight(), 4);
    t2 = Ticket();
    EXPECT_EQ(a.requests_in_flight(), 0);
    EXPECT_EQ(a.tokens_in_flight(), 0);
}

TEST(Admission, ARequestThatCanNeverFitIs400Not429) {
    AdmissionLimits l;
    l.max_queued_sequences = 100;
    l.max_queued_tokens = 5000;
    Admission a(l, {}, {});
    EXPECT_EQ(status_of([&] { a.admit(kCaller, {101, 10}); }), 400);
    EXPECT_EQ(status_of([&] { a.admit(kCaller, {1, 5001}); }), 400);
    EXPECT_EQ(a.requests_in_flight(), 0);
}

TEST(Admission, ShapeLimits) {
    AdmissionLimits l;
    l.max_n = 4;
    l.max_prompts = 3;
    Admission a(l, {}, {});
    EXPECT_EQ(status_of([&] { a.check_shape(4, 3); }), 0);
    EXPECT_EQ(status_of([&] { a.check_shape(5, 1); }), 400);
    EXPECT_EQ(status_of([&] { a.check_shape(1, 4); }), 400);
}

TEST(Admission, CallerChecks) {
    Admission a({}, {}, {"sk-1"});
    EXPECT_EQ(status_of([&] { a.check_caller({"grpc", "Bearer sk-1", ""}, true, false); }), 0);
    EXPECT_EQ(status_of([&] { a.check_caller({"grpc", "Bearer sk-2", ""}, true, false); }), 401);
    EXPECT_EQ(status_of([&] { a.check_caller({"grpc", "", ""}, true, false); }), 401);
    EXPECT_EQ(status_of([&] { a.check_caller({"ws", "bearer sk-1", ""}, false, false); }), 503);
    EXPECT_EQ(status_of([&] { a.check_caller({"http", "Bearer sk-1", ""}, true, true); }), 503);
}

TEST(Admission, RateLimitsAndTheNeverFittingRequest) {
    RateLimitOptions r;
    r.requests_per_minute = 2;
    r.tokens_per_minute = 1000;
    Admission a({}, r, {});
    std::string code;
    EXPECT_EQ(status_of([&] { a.admit(kCaller, {1, 1001}); }, &code), 413);  // retrying cannot help
    EXPECT_EQ(code, "tokens_exceed_rate_limit");
    EXPECT_EQ(a.requests_in_flight(), 0);
    Ticket t = a.admit(kCaller, {1, 10});
    a.charge(kCaller);
    EXPECT_EQ(status_of([&] { a.admit(kCaller, {1, 10}); }, &code), 429);
    EXPECT_EQ(code, "rate_limit_exceeded");
    // Another address has its own buckets.
    EXPECT_EQ(status_of([&] { a.admit({"grpc", "", "10.0.0.2:1"}, {1, 10}); }), 0);
}

}  // namespace
}  // namespace peregrine::server
