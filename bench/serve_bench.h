// `peregrine bench serve`: a load generator that speaks the OpenAI API (completions or chat) to
// any server, in the manner of vLLM's benchmark_serving. Every request streams (SSE) over one of
// `concurrency` keep-alive connections; the client records the time to the first content chunk,
// the gaps between content chunks, the end-to-end latency, and the token counts from the final
// usage chunk (`stream_options.include_usage`). A request fails on a connection error, a status
// other than 200, an event that is not JSON or carries an error, or a stream without [DONE].
//
// Two workloads (`dataset`): "random" sends num_requests independent random prompts; "multi-turn"
// simulates num_users chats that share one system prompt, each turn resending the whole
// conversation so far (including the answers the server returned), so later turns can hit the
// prefix cache. Before and after the run the client reads the servers' Prometheus /metrics and
// reports the prefix-cache hit rate they saw over the run.
//
// Beast stays inside serve_bench.cc; the pieces below it (SSE splitting, conversations, metrics
// parsing, statistics, report) are plain code, tested on their own.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine::bench {

struct ServeBenchOptions {
    std::string url = "http://127.0.0.1:8000";  // scheme, host, port, optional path prefix (a trailing /v1 is dropped)
    std::string endpoint = "completions";       // "completions" or "chat"
    std::string model;                          // "" = ask GET /v1/models for the first model
    std::string api_key;                        // sent as Authorization: Bearer
    int num_requests = 1000;
    int concurrency = 64;
    // Threads of the client, each with its share of the connections (random dataset; a
    // multi-turn run uses one). 0: a quarter of the cores, 1 to 8. One thread parses ~100k
    // events/s: past that the client, not the server, would be measured.
    int client_threads = 0;
    double request_rate = 0;           // requests/s as a Poisson process; 0 = all at once (bounded by concurrency)
    int prompt_len = 32;               // prompt tokens (ids) or words
    int output_len = 64;               // max_tokens, with ignore_eos so every request generates exactly this many
    std::string prompt_kind = "auto";  // "ids" (random token ids, completions only), "words", "auto"
    int token_id_min = 100;            // random ids are drawn from [token_id_min, token_id_max]
    int token_id_max = 499;
    double temperature = 0;
    uint64_t seed = 0;
    double timeout_s = 600;          // per request
    std::string dataset = "random";  // "random" or "multi-turn"
    // multi-turn: num_requests becomes num_users * turns; prompts are words (text).
    int num_users = 16;
    int turns = 4;
    int system_prompt_len = 256;  // words, the same system prompt for every user
    int turn_len = 32;            // words of each user turn
    // "interleaved": every user is live at once; a user's next turn queues behind the turns other
    // users are waiting to send (many people chatting, each reading the answer before replying),
    // so the servers hold every conversation between its turns. "sequential": one user plays
    // all of its turns back to back, then the next user starts (only `concurrency` users live).
    std::string turn_order = "interleaved";
    // Prometheus endpoints read before and after the run; empty = the target URL's /metrics.
    // An entry whose path ends in /metrics is used as is, otherwise /metrics is appended.
    std::vector<std::string> metrics_urls;
};

// One request's measurements (times in seconds from when it was sent).
struct RequestResult {
    bool ok = false;
    std::string
        error_kind;     // "connect", "io", "timeout", "http_<status>", "malformed_sse", "error_event", "missing_done"
    std::string error;  // a human-readable detail
    double ttft = 0;    // first content chunk
    double e2e = 0;     // end of the response
    std::vector<double> itl;  // between successive content chunks
    int64_t prompt_tokens = 0;
    int64_t output_tokens = 0;  // from usage; content chunks when the server sent no usage
    bool had_usage = false;
    int turn = -1;     // multi-turn: the turn index (0-based); -1 otherwise
    std::string text;  // the generated text, when the tracker was asked to keep it
};

// Splits a byte stream into server-sent events; returns the data of each complete event
// (several `data:` lines joined by '\n'; comments and other fields are dropped).
class SseSplitter {
  public:
    std::vector<std::string> feed(std::string_view bytes);
    // Bytes of an event not yet terminated by a blank line.
    bool has_partial() const;

  private:
    std::string buf_;
};

// Handles the events of one streamed request; call finish() at the end of the body.
class StreamTracker {
  public:
    // keep_text: collect the generated text into RequestResult::text.
    explicit StreamTracker(bool chat, bool keep_text = false) : chat_(chat), keep_text_(keep_text) {}
    // `now`: seconds since the request was sent.
    void on_event(const std::string& data, double now);
    // Completes `r` (ok, error, timings, tokens) from what was seen.
    void finish(double now, RequestResult& r);
    bool failed() const { return !error_kind_.empty(); }

  private:
    bool chat_;
    bool keep_text_;
    std::string text_;
    bool done_ = false;
    bool seen_content_ = false;
    double first_ = 0, last_ = 0;
    std::vector<double> itl_;
    int64_t chunks_ = 0;
    int64_t prompt_tokens_ = 0, output_tokens_ = 0;
    bool had_usage_ = false;
    std::string error_kind_, error_;
};

// One simulated user's chat (multi-turn). Turn k sends the system prompt, then for each earlier
// turn j the user text and answers[j] verbatim, then user_texts[k].
struct Conversation {
    std::string system_prompt;
    std::vector<std::string> user_texts;  // one per turn
    std::vector<std::string> answers;     // what the server returned, for the turns done so far
    // The completions prompt of turn k ("<system>\n\nUser: <text>\n\nAssistant:<answer>..."); needs k answers.
    std::string prompt(size_t k) const;
    // The chat messages of turn k (system, then user/assistant pairs, then the new user message).
    nlohmann::json messages(size_t k) const;
};
// num_users conversations of `turns` turns, deterministic in `seed`; answers left empty.
std::vector<Conversation> build_conversations(const ServeBenchOptions& o);

// Prefix-cache counters from a Prometheus text exposition: vllm:prefix_cache_{hits,queries}_total
// summed over all label sets, or the peregrine: names when no vllm: pair is present.
struct PrefixCacheCounters {
    bool found = false;
    double hits = 0, queries = 0;
};
PrefixCacheCounters parse_prefix_cache_counters(std::string_view metrics_text);

// The counters' change over a run, summed over the servers read both before and after.
struct PrefixCacheStats {
    std::vector<std::string> urls;  // the metrics endpoints asked
    int servers_read = 0;           // endpoints with both counters before and after the run
    double hits = 0, queries = 0;   // deltas, in tokens
    std::vector<std::string> errors;
    // Adds one server's delta (a counter that went down was reset: its value after counts whole).
    void add(const PrefixCacheCounters& before, const PrefixCacheCounters& after);
    // hits / queries; nullopt when no server was read or nothing was queried.
    std::optional<double> hit_rate() const;
};

struct Distribution {
    double mean = 0, median = 0, p90 = 0, p99 = 0, std = 0, max = 0;
};
// numpy.percentile's default (linear interpolation); q in [0, 100]. 0 for an empty set.
double percentile(std::vector<double> values, double q);
Distribution distribution(const std::vector<double>& values);

struct ServeBenchSummary {
    int64_t completed = 0, failed = 0;
    double duration_s = 0;
    int64_t total_input_tokens = 0, total_output_tokens = 0;
    double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
    Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
    int64_t output_len_mismatches = 0;        // successful requests whose output differed from output_len
    int64_t without_usage = 0;                // successful requests that carried no usage chunk
    std::map<std::string, int64_t> errors;    // by kind
    std::vector<std::string> error_examples;  // a few distinct messages
    // multi-turn: mean TTFT of the successful requests of each turn (nullopt: none succeeded).
    std::vector<std::optional<double>> ttft_ms_by_turn;
    std::optional<double> ttft_ms_first_turn, ttft_ms_later_turns;
    PrefixCacheStats prefix_cache;  // filled by run_serve_bench
};

ServeBenchSummary summarize(const std::vector<RequestResult>& results, double duration_s, int expected_output_len);
// The table printed at the end of a run (vLLM's layout).
std::string format_summary(const ServeBenchSummary& s, const ServeBenchOptions& o);
// The same numbers (vLLM's key names) plus the configuration.
nlohmann::json summary_json(const ServeBenchSummary& s, const ServeBenchOptions& o);

// Runs the benchmark; throws peregrine::Error for a bad URL or when the model cannot be found.
// Fills in what `options` left to be found (model, prompt_kind "auto").
ServeBenchSummary run_serve_bench(ServeBenchOptions& options, bool progress = true);

}  // namespace peregrine::bench
