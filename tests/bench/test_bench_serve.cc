// `peregrine bench serve`: SSE splitting, per-stream bookkeeping and the statistics.
#include <gtest/gtest.h>

#include "bench/serve_bench.h"

namespace peregrine::bench {
namespace {

TEST(BenchSseSplitter, SplitsEventsAcrossReads) {
    SseSplitter s;
    EXPECT_TRUE(s.feed("data: {\"a\":").empty());
    EXPECT_TRUE(s.has_partial());
    auto ev = s.feed("1}\n\ndata: [DONE]\n");
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0], "{\"a\":1}");
    ev = s.feed("\n");
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0], "[DONE]");
    EXPECT_FALSE(s.has_partial());
}

TEST(BenchSseSplitter, CrLfCommentsAndMultiLineData) {
    SseSplitter s;
    auto ev = s.feed(": keep-alive\r\n\r\nevent: x\r\ndata:one\r\ndata: two\r\n\r\ndata: three\n\n");
    ASSERT_EQ(ev.size(), 2u);
    EXPECT_EQ(ev[0], "one\ntwo");
    EXPECT_EQ(ev[1], "three");
}

TEST(BenchStreamTracker, CompletionsTimingsAndUsage) {
    StreamTracker t(/*chat=*/false);
    t.on_event(R"({"choices":[{"index":0,"text":"Once"}]})", 0.010);
    t.on_event(R"({"choices":[{"index":0,"text":""}]})", 0.012);  // no content: not a token
    t.on_event(R"({"choices":[{"index":0,"text":" upon"}]})", 0.015);
    t.on_event(R"({"choices":[{"index":0,"text":" a","finish_reason":"length"}]})", 0.022);
    t.on_event(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}})", 0.023);
    t.on_event("[DONE]", 0.024);
    RequestResult r;
    t.finish(0.025, r);
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_DOUBLE_EQ(r.ttft, 0.010);
    EXPECT_DOUBLE_EQ(r.e2e, 0.025);
    ASSERT_EQ(r.itl.size(), 2u);
    EXPECT_NEAR(r.itl[0], 0.005, 1e-12);
    EXPECT_NEAR(r.itl[1], 0.007, 1e-12);
    EXPECT_EQ(r.prompt_tokens, 5);
    EXPECT_EQ(r.output_tokens, 3);
    EXPECT_TRUE(r.had_usage);
}

TEST(BenchStreamTracker, ChatRoleDeltaIsNotContent) {
    StreamTracker t(/*chat=*/true);
    t.on_event(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", 0.001);
    t.on_event(R"({"choices":[{"index":0,"delta":{"content":"Hi"}}]})", 0.004);
    t.on_event(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", 0.005);
    t.on_event("[DONE]", 0.006);
    RequestResult r;
    t.finish(0.006, r);
    EXPECT_TRUE(r.ok);
    EXPECT_DOUBLE_EQ(r.ttft, 0.004);
    EXPECT_EQ(r.output_tokens, 1);  // no usage: content chunks are counted
    EXPECT_FALSE(r.had_usage);
}

TEST(BenchStreamTracker, Failures) {
    {
        StreamTracker t(false);
        t.on_event(R"({"choices":[{"text":"x"}]})", 0.001);
        RequestResult r;
        t.finish(0.002, r);
        EXPECT_FALSE(r.ok);
        EXPECT_EQ(r.error_kind, "missing_done");
    }
    {
        StreamTracker t(false);
        t.on_event("not json", 0.001);
        t.on_event("[DONE]", 0.002);
        RequestResult r;
        t.finish(0.002, r);
        EXPECT_EQ(r.error_kind, "malformed_sse");
    }
    {
        StreamTracker t(false);
        t.on_event(R"({"error":{"message":"boom"}})", 0.001);
        t.on_event("[DONE]", 0.002);
        RequestResult r;
        t.finish(0.002, r);
        EXPECT_EQ(r.error_kind, "error_event");
    }
}

TEST(BenchStats, PercentilesMatchNumpy) {
    const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    EXPECT_DOUBLE_EQ(percentile(v, 50), 5.5);
    EXPECT_NEAR(percentile(v, 90), 9.1, 1e-12);
    EXPECT_NEAR(percentile(v, 99), 9.91, 1e-12);
    EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
    const Distribution d = distribution({4, 1, 3, 2});
    EXPECT_DOUBLE_EQ(d.mean, 2.5);
    EXPECT_DOUBLE_EQ(d.median, 2.5);
    EXPECT_DOUBLE_EQ(d.max, 4);
}

TEST(BenchStats, SummaryCountsAndThroughput) {
    std::vector<RequestResult> rs(3);
    for (int i = 0; i < 2; ++i) {
        rs[i].ok = true;
        rs[i].ttft = 0.1;
        rs[i].e2e = 0.1 + 0.01 * 9;  // 10 tokens: TPOT 10 ms
        rs[i].prompt_tokens = 4;
        rs[i].output_tokens = 10;
        rs[i].had_usage = true;
        rs[i].itl = std::vector<double>(9, 0.01);
    }
    rs[2].ok = false;
    rs[2].error_kind = "http_500";
    rs[2].error = "HTTP 500";
    const ServeBenchSummary s = summarize(rs, 2.0, 10);
    EXPECT_EQ(s.completed, 2);
    EXPECT_EQ(s.failed, 1);
    EXPECT_EQ(s.errors.at("http_500"), 1);
    EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
    EXPECT_DOUBLE_EQ(s.output_throughput, 10.0);
    EXPECT_DOUBLE_EQ(s.total_token_throughput, 14.0);
    EXPECT_NEAR(s.tpot_ms.mean, 10.0, 1e-9);
    EXPECT_NEAR(s.itl_ms.median, 10.0, 1e-9);
    EXPECT_NEAR(s.ttft_ms.p99, 100.0, 1e-9);
    EXPECT_EQ(s.output_len_mismatches, 0);
    ServeBenchOptions o;
    const auto j = summary_json(s, o);
    EXPECT_EQ(j["failed"], 1);
    EXPECT_TRUE(j.contains("p99_ttft_ms"));
    EXPECT_NE(format_summary(s, o).find("Failed requests:"), std::string::npos);
}

}  // namespace
}  // namespace peregrine::bench
