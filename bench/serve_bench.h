// `peregrine bench serve`: a load generator that speaks the OpenAI API (completions or chat) to
// any server, in the manner of vLLM's benchmark_serving. Every request streams (SSE) over one of
// `concurrency` keep-alive connections; the client records the time to the first content chunk,
// the gaps between content chunks, the end-to-end latency, and the token counts from the final
// usage chunk (`stream_options.include_usage`). A request fails on a connection error, a status
// other than 200, an event that is not JSON or carries an error, or a stream without [DONE].
//
// Beast stays inside serve_bench.cc; the pieces below it (SSE splitting, statistics, report)
// are plain code, tested on their own.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
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
    double request_rate = 0;           // requests/s as a Poisson process; 0 = all at once (bounded by concurrency)
    int prompt_len = 32;               // prompt tokens (ids) or words
    int output_len = 64;               // max_tokens, with ignore_eos so every request generates exactly this many
    std::string prompt_kind = "auto";  // "ids" (random token ids, completions only), "words", "auto"
    int token_id_min = 100;            // random ids are drawn from [token_id_min, token_id_max]
    int token_id_max = 499;
    double temperature = 0;
    uint64_t seed = 0;
    double timeout_s = 600;  // per request
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
    explicit StreamTracker(bool chat) : chat_(chat) {}
    // `now`: seconds since the request was sent.
    void on_event(const std::string& data, double now);
    // Completes `r` (ok, error, timings, tokens) from what was seen.
    void finish(double now, RequestResult& r);
    bool failed() const { return !error_kind_.empty(); }

  private:
    bool chat_;
    bool done_ = false;
    bool seen_content_ = false;
    double first_ = 0, last_ = 0;
    std::vector<double> itl_;
    int64_t chunks_ = 0;
    int64_t prompt_tokens_ = 0, output_tokens_ = 0;
    bool had_usage_ = false;
    std::string error_kind_, error_;
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
