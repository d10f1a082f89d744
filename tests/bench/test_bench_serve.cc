// `peregrine bench serve`: SSE splitting, per-stream bookkeeping, multi-turn conversations,
// prefix-cache counters and the statistics.
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

TEST(BenchStreamTracker, KeepsTextWhenAsked) {
    StreamTracker t(/*chat=*/false, /*keep_text=*/true);
    t.on_event(R"({"choices":[{"index":0,"text":"Once"}]})", 0.001);
    t.on_event(R"({"choices":[{"index":0,"text":" upon"}]})", 0.002);
    t.on_event("[DONE]", 0.003);
    RequestResult r;
    t.finish(0.003, r);
    EXPECT_EQ(r.text, "Once upon");
    StreamTracker plain(false);
    plain.on_event(R"({"choices":[{"index":0,"text":"x"}]})", 0.001);
    plain.on_event("[DONE]", 0.002);
    RequestResult r2;
    plain.finish(0.002, r2);
    EXPECT_TRUE(r2.text.empty());
}

ServeBenchOptions multi_turn_options() {
    ServeBenchOptions o;
    o.dataset = "multi-turn";
    o.num_users = 3;
    o.turns = 4;
    o.system_prompt_len = 20;
    o.turn_len = 5;
    o.seed = 7;
    return o;
}

size_t word_count(const std::string& s) {
    size_t n = 0;
    bool in_word = false;
    for (char c : s) {
        if (c == ' ') {
            in_word = false;
        } else if (!in_word) {
            in_word = true;
            ++n;
        }
    }
    return n;
}

TEST(BenchMultiTurn, UsersShareTheSystemPromptAndDiffer) {
    const ServeBenchOptions o = multi_turn_options();
    const std::vector<Conversation> users = build_conversations(o);
    ASSERT_EQ(users.size(), 3u);
    EXPECT_EQ(word_count(users[0].system_prompt), 20u);
    for (const Conversation& c : users) {
        EXPECT_EQ(c.system_prompt, users[0].system_prompt);
        ASSERT_EQ(c.user_texts.size(), 4u);
        for (const std::string& t : c.user_texts) EXPECT_EQ(word_count(t), 5u);
        EXPECT_TRUE(c.answers.empty());
    }
    EXPECT_NE(users[0].user_texts, users[1].user_texts);
    // Deterministic in the seed, and a user's words do not depend on how many users there are.
    ServeBenchOptions more = o;
    more.num_users = 5;
    const std::vector<Conversation> again = build_conversations(more);
    EXPECT_EQ(again[1].system_prompt, users[1].system_prompt);
    EXPECT_EQ(again[1].user_texts, users[1].user_texts);
    ServeBenchOptions other = o;
    other.seed = 8;
    EXPECT_NE(build_conversations(other)[0].system_prompt, users[0].system_prompt);
}

TEST(BenchMultiTurn, TurnPromptHoldsTheWholeConversationInOrder) {
    Conversation c;
    c.system_prompt = "SYS words";
    c.user_texts = {"u one", "u two", "u three"};
    EXPECT_EQ(c.prompt(0), "SYS words\n\nUser: u one\n\nAssistant:");
    EXPECT_THROW(c.prompt(1), std::exception);  // turn 1 needs the answer of turn 0
    c.answers = {" a one"};
    const std::string p1 = c.prompt(1);
    EXPECT_EQ(p1, "SYS words\n\nUser: u one\n\nAssistant: a one\n\nUser: u two\n\nAssistant:");
    c.answers.push_back(" a two\nmore");
    const std::string p2 = c.prompt(2);
    // Each turn's prompt starts with the previous prompt plus its answer: the prefix a cache can reuse.
    EXPECT_TRUE(p2.starts_with(p1 + c.answers[1]));
    size_t at = 0;
    for (const std::string& part :
         {c.system_prompt, c.user_texts[0], c.answers[0], c.user_texts[1], c.answers[1], c.user_texts[2]}) {
        const size_t found = p2.find(part, at);
        ASSERT_NE(found, std::string::npos) << part;
        at = found + part.size();
    }
    EXPECT_TRUE(p2.ends_with("\n\nAssistant:"));
    EXPECT_THROW(c.prompt(3), std::exception);  // only three turns

    const nlohmann::json m = c.messages(2);
    ASSERT_EQ(m.size(), 6u);
    EXPECT_EQ(m[0]["role"], "system");
    EXPECT_EQ(m[0]["content"], "SYS words");
    EXPECT_EQ(m[1]["role"], "user");
    EXPECT_EQ(m[1]["content"], "u one");
    EXPECT_EQ(m[2]["role"], "assistant");
    EXPECT_EQ(m[2]["content"], " a one");
    EXPECT_EQ(m[3]["content"], "u two");
    EXPECT_EQ(m[4]["content"], " a two\nmore");
    EXPECT_EQ(m[5]["role"], "user");
    EXPECT_EQ(m[5]["content"], "u three");
    EXPECT_EQ(c.messages(0).size(), 2u);
}

TEST(BenchPrefixCacheMetrics, ParsesLabelledCountersAndPrefersVllm) {
    const std::string text =
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        "vllm:prefix_cache_queries_total{model_name=\"m\"} 1000\n"
        "vllm:prefix_cache_hits_total{model_name=\"m\"} 250\n"
        "vllm:prefix_cache_hits_total{model_name=\"odd } name\\\"\",engine=\"1\"} 50 1700000000000\n"
        "vllm:prefix_cache_queries_total{model_name=\"odd } name\\\"\",engine=\"1\"} 100\n"
        "vllm:prefix_cache_hits_created{model_name=\"m\"} 1.7e9\n"
        "peregrine:prefix_cache_queries_total{model_name=\"m\"} 7\n"
        "peregrine:prefix_cache_hits_total{model_name=\"m\"} 3\n"
        "vllm:num_requests_running{model_name=\"m\"} 4\n";
    const PrefixCacheCounters c = parse_prefix_cache_counters(text);
    EXPECT_TRUE(c.found);
    EXPECT_DOUBLE_EQ(c.hits, 300);  // summed over label sets
    EXPECT_DOUBLE_EQ(c.queries, 1100);

    const PrefixCacheCounters p = parse_prefix_cache_counters(
        "peregrine:prefix_cache_queries_total{model_name=\"m\"} 7\r\n"
        "peregrine:prefix_cache_hits_total 3e0\r\n");
    EXPECT_TRUE(p.found);
    EXPECT_DOUBLE_EQ(p.hits, 3);
    EXPECT_DOUBLE_EQ(p.queries, 7);

    // Only one of the pair, or nothing: not found.
    EXPECT_FALSE(parse_prefix_cache_counters("vllm:prefix_cache_hits_total{model_name=\"m\"} 5\n").found);
    EXPECT_FALSE(parse_prefix_cache_counters("").found);
    EXPECT_FALSE(parse_prefix_cache_counters("<html>not found</html>").found);
}

TEST(BenchPrefixCacheMetrics, HitRateOverServers) {
    PrefixCacheStats s;
    EXPECT_FALSE(s.hit_rate().has_value());  // nothing read
    s.add({true, 100, 400}, {true, 160, 500});
    s.add({true, 0, 0}, {true, 40, 100});
    EXPECT_EQ(s.servers_read, 2);
    EXPECT_DOUBLE_EQ(s.hits, 100);
    EXPECT_DOUBLE_EQ(s.queries, 200);
    ASSERT_TRUE(s.hit_rate().has_value());
    EXPECT_DOUBLE_EQ(*s.hit_rate(), 0.5);
    s.add({false, 0, 0}, {true, 5, 5});  // not read before: ignored
    EXPECT_EQ(s.servers_read, 2);
    s.add({true, 1000, 2000}, {true, 10, 20});  // restarted: the counters went down
    EXPECT_DOUBLE_EQ(s.hits, 110);
    EXPECT_DOUBLE_EQ(s.queries, 220);

    PrefixCacheStats idle;
    idle.add({true, 5, 9}, {true, 5, 9});  // read, but no queries during the run
    EXPECT_EQ(idle.servers_read, 1);
    EXPECT_FALSE(idle.hit_rate().has_value());
}

// The value printed after `label` in the summary table ("" when there is no such line).
std::string value_of(const std::string& text, const std::string& label) {
    const size_t at = text.find("\n" + label);
    if (at == std::string::npos) return "";
    const size_t begin = text.find_first_not_of(' ', at + 1 + label.size());
    return text.substr(begin, text.find('\n', begin) - begin);
}

TEST(BenchStats, TtftByTurnAndPrefixCacheInReport) {
    std::vector<RequestResult> rs;
    auto add = [&](int turn, double ttft, bool ok) {
        RequestResult r;
        r.ok = ok;
        r.turn = turn;
        r.ttft = ttft;
        r.e2e = ttft + 0.01;
        r.output_tokens = 2;
        r.had_usage = true;
        if (!ok) r.error_kind = "previous_turn_failed";
        rs.push_back(r);
    };
    add(0, 0.100, true);
    add(0, 0.200, true);
    add(1, 0.020, true);
    add(1, 0.040, true);
    add(2, 0.030, true);
    add(3, 0.5, false);
    ServeBenchSummary s = summarize(rs, 1.0, 2);
    ASSERT_EQ(s.ttft_ms_by_turn.size(), 4u);
    EXPECT_NEAR(*s.ttft_ms_by_turn[0], 150, 1e-9);
    EXPECT_NEAR(*s.ttft_ms_by_turn[1], 30, 1e-9);
    EXPECT_NEAR(*s.ttft_ms_by_turn[2], 30, 1e-9);
    EXPECT_FALSE(s.ttft_ms_by_turn[3].has_value());  // all failed
    EXPECT_NEAR(*s.ttft_ms_first_turn, 150, 1e-9);
    EXPECT_NEAR(*s.ttft_ms_later_turns, 30, 1e-9);

    ServeBenchOptions o = multi_turn_options();
    s.prefix_cache.urls = {"http://a:1", "http://b:2"};
    s.prefix_cache.add({true, 0, 0}, {true, 30, 120});
    s.prefix_cache.errors = {"http://b:2: connect: refused"};
    const nlohmann::json j = summary_json(s, o);
    EXPECT_EQ(j["dataset"], "multi-turn");
    EXPECT_DOUBLE_EQ(j["prefix_cache_hit_rate"].get<double>(), 0.25);
    EXPECT_DOUBLE_EQ(j["prefix_cache_hits"].get<double>(), 30);
    EXPECT_DOUBLE_EQ(j["prefix_cache_queries"].get<double>(), 120);
    EXPECT_EQ(j["prefix_cache_servers_read"], 1);
    ASSERT_EQ(j["ttft_ms_by_turn"].size(), 4u);
    EXPECT_NEAR(j["ttft_ms_by_turn"][1].get<double>(), 30, 1e-9);
    EXPECT_TRUE(j["ttft_ms_by_turn"][3].is_null());
    const std::string text = format_summary(s, o);
    EXPECT_EQ(value_of(text, "Prefix cache hit rate:"), "25.00%") << text;
    EXPECT_EQ(value_of(text, "Metrics read (servers):"), "1/2") << text;
    EXPECT_EQ(value_of(text, "Mean TTFT turn 1 (ms):"), "150.00") << text;
    EXPECT_EQ(value_of(text, "Mean TTFT turns 2+ (ms):"), "30.00") << text;

    // No metrics: n/a, not a failure.
    ServeBenchSummary none = summarize(rs, 1.0, 2);
    EXPECT_TRUE(summary_json(none, o)["prefix_cache_hit_rate"].is_null());
    EXPECT_EQ(value_of(format_summary(none, o), "Prefix cache hit rate:"), "n/a (no metrics read)");
}

}  // namespace
}  // namespace peregrine::bench
