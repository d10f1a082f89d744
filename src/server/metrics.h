// Prometheus metrics for GET /metrics: histograms and per-request counters fed by the server as
// requests finish, and the text exposition format (version 0.0.4) that renders them together with
// the engine's gauges and counters. Names follow vLLM's set under a `peregrine:` prefix.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "peregrine/engine_config.h"
#include "peregrine/engine_types.h"

namespace peregrine::server {

// Cumulative buckets (upper bounds, ascending; +Inf is implicit), their sum and count.
// Not thread-safe by itself: ServerMetrics guards it.
class Histogram {
  public:
    explicit Histogram(std::vector<double> bounds);
    // `count` observations of `value` (e.g. a request's mean inter-token latency, once per interval).
    void observe(double value, uint64_t count = 1);

    const std::vector<double>& bounds() const { return bounds_; }
    // Cumulative count of observations <= bounds()[i]; index bounds().size() is +Inf (= count()).
    uint64_t cumulative(size_t i) const;
    double sum() const { return sum_; }
    uint64_t count() const { return count_; }

  private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // [bounds.size() + 1], per bucket (not cumulative)
    double sum_ = 0;
    uint64_t count_ = 0;
};

// Appends Prometheus text exposition to a string. `labels` is the rendered label set without
// braces, e.g. `model_name="x"`.
class PrometheusWriter {
  public:
    void header(std::string_view name, std::string_view type, std::string_view help);
    void sample(std::string_view name, std::string_view labels, double value);
    void histogram(std::string_view name, std::string_view labels, const Histogram& h);
    const std::string& text() const { return out_; }

  private:
    std::string out_;
};

// `value` escaped for a label value ("\\", "\"", "\n").
std::string escape_label(std::string_view value);

// What the server itself measures, request by request (thread-safe).
class ServerMetrics {
  public:
    ServerMetrics();
    // One engine request's last output: its finish reason, usage and timing.
    void observe_request(FinishReason finish, const Usage& usage, const RequestTiming& timing);
    // The whole exposition: the engine's stats and what observe_request gathered.
    std::string render(std::string_view model_name, const EngineStats& stats) const;

  private:
    mutable std::mutex mu_;
    uint64_t success_stop_ = 0, success_length_ = 0, success_abort_ = 0;
    Histogram ttft_, itl_, e2e_, queue_, prompt_tokens_, generation_tokens_, max_generation_tokens_;
    // vLLM's per-request phase histograms (its Grafana dashboard's panels): prefill (first
    // scheduled to first token), decode (first to last token), their sum, and the request's
    // mean time per output token.
    Histogram prefill_, decode_, inference_, tpot_;
};

}  // namespace peregrine::server
