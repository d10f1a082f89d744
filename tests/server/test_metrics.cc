// The /metrics exposition text (histogram buckets, labels, HELP/TYPE) and the rate limiter's buckets.
#include <gtest/gtest.h>

#include "server/metrics.h"
#include "server/rate_limit.h"

namespace peregrine::server {
namespace {

TEST(Metrics, HistogramIsCumulative) {
    Histogram h({0.1, 1.0});
    h.observe(0.05);
    h.observe(0.1);  // on the bound: counted in le="0.1"
    h.observe(0.5, 3);
    h.observe(7.0);
    EXPECT_EQ(h.cumulative(0), 2u);
    EXPECT_EQ(h.cumulative(1), 5u);
    EXPECT_EQ(h.cumulative(2), 6u);
    EXPECT_EQ(h.count(), 6u);
    EXPECT_DOUBLE_EQ(h.sum(), 0.05 + 0.1 + 1.5 + 7.0);
}

TEST(Metrics, WriterFormatsHistogram) {
    Histogram h({0.5, 2});
    h.observe(1);
    h.observe(3);
    PrometheusWriter w;
    w.header("x:lat_seconds", "histogram", "Latency.");
    w.histogram("x:lat_seconds", "model_name=\"m\"", h);
    EXPECT_EQ(w.text(),
              "# HELP x:lat_seconds Latency.\n"
              "# TYPE x:lat_seconds histogram\n"
              "x:lat_seconds_bucket{model_name=\"m\",le=\"0.5\"} 0\n"
              "x:lat_seconds_bucket{model_name=\"m\",le=\"2\"} 1\n"
              "x:lat_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2\n"
              "x:lat_seconds_sum{model_name=\"m\"} 4\n"
              "x:lat_seconds_count{model_name=\"m\"} 2\n");
    EXPECT_EQ(escape_label("a\"b\\c\n"), "a\\\"b\\\\c\\n");
}

TEST(Metrics, RenderHasEveryFamily) {
    ServerMetrics m;
    Usage u;
    u.prompt_tokens = 5;
    u.completion_tokens = 11;
    u.max_choice_tokens = 7;  // n > 1: the longest choice's share
    RequestTiming t;
    t.queue = 0.002;
    t.time_to_first_token = 0.03;
    t.prefill = 0.028;
    t.decode = 0.5;
    t.total = 0.53;
    m.observe_request(FinishReason::Length, u, t);
    m.observe_request(FinishReason::Stop, u, t);
    EngineStats s;
    s.num_running = 2;
    s.num_waiting = 1;
    s.num_kv_blocks = 8;
    s.num_kv_blocks_used = 2;
    s.block_size = 16;
    s.prompt_tokens = 10;
    s.preemptions = 5;
    s.swap_preemptions = 3;
    s.kv_swapped_out_blocks = 4;
    s.kv_swapped_in_blocks = 2;
    s.kv_block_bytes = 1000;
    const std::string text = m.render("my\"model", s);
    auto has = [&](const std::string& line) { return text.find(line) != std::string::npos; };
    EXPECT_TRUE(has("# TYPE peregrine:num_requests_running gauge\n"));
    EXPECT_TRUE(has("peregrine:num_requests_running{model_name=\"my\\\"model\"} 2\n"));
    EXPECT_TRUE(has("peregrine:num_requests_waiting{model_name=\"my\\\"model\"} 1\n"));
    EXPECT_TRUE(has("peregrine:kv_cache_usage_perc{model_name=\"my\\\"model\"} 0.25\n"));
    // vLLM's names, as the inference gateway reads them.
    EXPECT_TRUE(has("# TYPE vllm:num_requests_running gauge\n"));
    EXPECT_TRUE(has("vllm:num_requests_running{model_name=\"my\\\"model\"} 2\n"));
    EXPECT_TRUE(has("vllm:num_requests_waiting{model_name=\"my\\\"model\"} 1\n"));
    EXPECT_TRUE(has("vllm:kv_cache_usage_perc{model_name=\"my\\\"model\"} 0.25\n"));
    EXPECT_TRUE(has("vllm:cache_config_info{model_name=\"my\\\"model\",block_size=\"16\",num_gpu_blocks=\"8\"} 1\n"));
    // With the KV cache's element type known, vLLM's cache_dtype label (the router reads the rest).
    s.kv_cache_dtype = "f8_e4m3";
    const std::string fp8 = m.render("m", s);
    EXPECT_NE(fp8.find("vllm:cache_config_info{model_name=\"m\",block_size=\"16\",cache_dtype=\"f8_e4m3\","
                       "num_gpu_blocks=\"8\"} 1\n"),
              std::string::npos);
    EXPECT_TRUE(has("# TYPE vllm:prefix_cache_hits_total counter\n"));
    EXPECT_TRUE(has("# TYPE peregrine:prompt_tokens_total counter\n"));
    EXPECT_TRUE(has("peregrine:prompt_tokens_total{model_name=\"my\\\"model\"} 10\n"));
    EXPECT_TRUE(has("peregrine:request_success_total{model_name=\"my\\\"model\",finished_reason=\"length\"} 1\n"));
    EXPECT_TRUE(has("peregrine:request_success_total{model_name=\"my\\\"model\",finished_reason=\"abort\"} 0\n"));
    // 10 gaps of 0.05 s each per request.
    EXPECT_TRUE(has("peregrine:inter_token_latency_seconds_count{model_name=\"my\\\"model\"} 20\n"));
    EXPECT_TRUE(has("peregrine:inter_token_latency_seconds_bucket{model_name=\"my\\\"model\",le=\"0.05\"} 20\n"));
    EXPECT_TRUE(has("peregrine:time_to_first_token_seconds_bucket{model_name=\"my\\\"model\",le=\"0.02\"} 0\n"));
    EXPECT_TRUE(has("peregrine:time_to_first_token_seconds_bucket{model_name=\"my\\\"model\",le=\"0.04\"} 2\n"));
    EXPECT_TRUE(has("peregrine:request_generation_tokens_bucket{model_name=\"my\\\"model\",le=\"20\"} 2\n"));
    EXPECT_TRUE(has("peregrine:request_max_num_generation_tokens_sum{model_name=\"my\\\"model\"} 14\n"));
    EXPECT_TRUE(has("peregrine:request_max_num_generation_tokens_bucket{model_name=\"my\\\"model\",le=\"5\"} 0\n"));
    // Per request: prefill 0.028 s, decode 0.5 s (their sum 0.528 s), 0.05 s a token.
    EXPECT_TRUE(has("peregrine:request_prefill_time_seconds_count{model_name=\"my\\\"model\"} 2\n"));
    EXPECT_TRUE(has("peregrine:request_time_per_output_token_seconds_count{model_name=\"my\\\"model\"} 2\n"));
    EXPECT_TRUE(
        has("peregrine:request_time_per_output_token_seconds_bucket{model_name=\"my\\\"model\",le=\"0.05\"} 2\n"));
    EXPECT_TRUE(has("peregrine:request_decode_time_seconds_sum{model_name=\"my\\\"model\"} 1\n"));
    for (const char* h : {"time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                          "request_prompt_tokens", "request_generation_tokens", "request_max_num_generation_tokens",
                          "request_prefill_time_seconds", "request_decode_time_seconds",
                          "request_inference_time_seconds", "request_time_per_output_token_seconds"})
        EXPECT_TRUE(has(std::string("# TYPE peregrine:") + h + " histogram\n")) << h;
    // Swap preemption: counts, and bytes = blocks x block bytes.
    EXPECT_TRUE(has("peregrine:num_preemptions_total{model_name=\"my\\\"model\"} 5\n"));
    EXPECT_TRUE(has("peregrine:num_swap_preemptions_total{model_name=\"my\\\"model\"} 3\n"));
    EXPECT_TRUE(has("peregrine:kv_swapped_out_bytes_total{model_name=\"my\\\"model\"} 4000\n"));
    EXPECT_TRUE(has("peregrine:kv_swapped_in_bytes_total{model_name=\"my\\\"model\"} 2000\n"));
    EXPECT_EQ(text.back(), '\n');
}

TEST(RateLimit, RequestsRefillOverTime) {
    RateLimiter r({.requests_per_minute = 2, .tokens_per_minute = 0});
    const auto t0 = RateLimiter::Clock::now();
    EXPECT_TRUE(r.admit("a", 0, t0).admitted);
    EXPECT_TRUE(r.admit("a", 0, t0).admitted);
    const auto d = r.admit("a", 0, t0);
    EXPECT_FALSE(d.admitted);
    EXPECT_EQ(d.retry_after_s, 30);
    EXPECT_TRUE(r.admit("b", 0, t0).admitted);  // another key, another bucket
    EXPECT_TRUE(r.admit("a", 0, t0 + std::chrono::seconds(30)).admitted);
}

TEST(RateLimit, TokensAreTakenOnlyOnAdmission) {
    RateLimiter r({.requests_per_minute = 0, .tokens_per_minute = 600});
    const auto t0 = RateLimiter::Clock::now();
    EXPECT_TRUE(r.admit("a", 500, t0).admitted);
    const auto d = r.admit("a", 200, t0);  // 100 left, 10 per second
    EXPECT_FALSE(d.admitted);
    EXPECT_EQ(d.retry_after_s, 10);
    EXPECT_TRUE(r.admit("a", 100, t0).admitted);  // the refusal took nothing
    EXPECT_TRUE(r.admit("a", 700, t0).never);
}

}  // namespace
}  // namespace peregrine::server
