#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace peregrine::server {

namespace {

// Seconds, as vLLM's buckets.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatencyBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0, 15.0,
                                             20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};

// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's build_1_2_5_buckets).
std::vector<double> buckets_1_2_5(double max) {
    std::vector<double> b;
    for (double scale = 1;; scale *= 10)
        for (double m : {1.0, 2.0, 5.0}) {
            if (m * scale > max) return b;
            b.push_back(m * scale);
        }
}

std::string format_value(double v) {
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    if (std::isnan(v)) return "NaN";
    if (v == std::floor(v) && std::fabs(v) < 1e15) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.0f", v);
        return buf;
    }
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    // Shortest text that reads back the same.
    for (int prec = 1; prec <= 17; ++prec) {
        char shorter[32];
        std::snprintf(shorter, sizeof(shorter), "%.*g", prec, v);
        if (std::strtod(shorter, nullptr) == v) return shorter;
    }
    return buf;
}

std::string with_label(std::string_view labels, std::string_view extra) {
    std::string s(labels);
    if (!s.empty() && !extra.empty()) s += ',';
    s += extra;
    return s;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, uint64_t count) {
    if (count == 0 || std::isnan(value)) return;
    const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
    counts_[i] += count;
    count_ += count;
    sum_ += value * static_cast<double>(count);
}

uint64_t Histogram::cumulative(size_t i) const {
    uint64_t c = 0;
    for (size_t k = 0; k <= i && k < counts_.size(); ++k) c += counts_[k];
    return c;
}

std::string escape_label(std::string_view value) {
    std::string out;
    for (char c : value) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
    return out;
}

void PrometheusWriter::header(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
}

void PrometheusWriter::sample(std::string_view name, std::string_view labels, double value) {
    out_ += name;
    if (!labels.empty()) {
        out_ += '{';
        out_ += labels;
        out_ += '}';
    }
    out_ += ' ';
    out_ += format_value(value);
    out_ += '\n';
}

void PrometheusWriter::histogram(std::string_view name, std::string_view labels, const Histogram& h) {
    const std::string bucket = std::string(name) + "_bucket";
    for (size_t i = 0; i <= h.bounds().size(); ++i) {
        const double le = i < h.bounds().size() ? h.bounds()[i] : INFINITY;
        sample(bucket, with_label(labels, "le=\"" + format_value(le) + "\""), static_cast<double>(h.cumulative(i)));
    }
    sample(std::string(name) + "_sum", labels, h.sum());
    sample(std::string(name) + "_count", labels, static_cast<double>(h.count()));
}

ServerMetrics::ServerMetrics()
    : ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kLatencyBuckets),
      queue_(kLatencyBuckets),
      prompt_tokens_(buckets_1_2_5(1 << 20)),
      generation_tokens_(buckets_1_2_5(1 << 20)),
      max_generation_tokens_(buckets_1_2_5(1 << 20)),
      prefill_(kLatencyBuckets),
      decode_(kLatencyBuckets),
      inference_(kLatencyBuckets),
      tpot_(kItlBuckets) {}

void ServerMetrics::observe_request(FinishReason finish, const Usage& usage, const RequestTiming& timing) {
    std::lock_guard lock(mu_);
    if (finish == FinishReason::Stop)
        ++success_stop_;
    else if (finish == FinishReason::Length)
        ++success_length_;
    else if (finish == FinishReason::Abort)
        ++success_abort_;
    e2e_.observe(timing.total);
    queue_.observe(timing.queue);
    prompt_tokens_.observe(usage.prompt_tokens);
    generation_tokens_.observe(usage.completion_tokens);
    max_generation_tokens_.observe(usage.max_choice_tokens);
    if (usage.completion_tokens > 0) ttft_.observe(timing.time_to_first_token);
    if (usage.completion_tokens > 0) {
        prefill_.observe(timing.prefill);
        decode_.observe(timing.decode);
        inference_.observe(timing.prefill + timing.decode);
    }
    // The request's mean gap between tokens: once per gap (inter-token latency) and once per
    // request (time per output token).
    if (usage.completion_tokens > 1) {
        const double gap = timing.decode / (usage.completion_tokens - 1);
        itl_.observe(gap, static_cast<uint64_t>(usage.completion_tokens - 1));
        tpot_.observe(gap);
    }
}

std::string ServerMetrics::render(std::string_view model_name, const EngineStats& s) const {
    const std::string model = "model_name=\"" + escape_label(model_name) + "\"";
    PrometheusWriter w;
    auto gauge = [&](const char* name, const char* help, double v) {
        w.header(name, "gauge", help);
        w.sample(name, model, v);
    };
    auto counter = [&](const char* name, const char* help, double v) {
        const std::string total = std::string(name) + "_total";
        w.header(total, "counter", help);
        w.sample(total, model, v);
    };
    const double kv_usage = s.num_kv_blocks > 0 ? static_cast<double>(s.num_kv_blocks_used) / s.num_kv_blocks : 0.0;
    gauge("peregrine:num_requests_running", "Number of requests in model execution batches.", s.num_running);
    gauge("peregrine:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting);
    gauge("peregrine:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_usage);
    // The same under vLLM's names and meanings: what the Kubernetes inference gateway's
    // endpoint pickers (and llm-d's scorers) read from a model server with no configuration.
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running);
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting);
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_usage);
    w.header("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    w.sample("vllm:cache_config_info",
             with_label(model, str_cat("block_size=\"", s.block_size,
                                       s.kv_cache_dtype.empty() ? "" : "\",cache_dtype=\"" + s.kv_cache_dtype,
                                       "\",num_gpu_blocks=\"", s.num_kv_blocks, "\"")),
             1.0);
    counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            static_cast<double>(s.prefix_queries));
    counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            static_cast<double>(s.prefix_hits));
    counter("peregrine:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            static_cast<double>(s.prefix_queries));
    counter("peregrine:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            static_cast<double>(s.prefix_hits));
    counter("peregrine:prefix_cache_evictions",
            "Blocks evicted from the KV cache's prefix cache (to the host tier where there is one).",
            static_cast<double>(s.evictions));
    // The host tier (--kv-offload-memory); zeros without one.
    counter("peregrine:host_prefix_cache_queries",
            "Host-tier prefix cache queries, in tokens (prompt tokens after the last KV-cache hit).",
            static_cast<double>(s.host_prefix_queries));
    counter("peregrine:host_prefix_cache_hits", "Host-tier prefix cache hits, in tokens (also in prefix_cache_hits).",
            static_cast<double>(s.host_prefix_hits));
    counter("peregrine:host_kv_evictions", "Blocks dropped from the host tier to make room for others.",
            static_cast<double>(s.host_evictions));
    counter("peregrine:kv_offloaded_blocks", "KV blocks copied from the KV cache to the host tier.",
            static_cast<double>(s.kv_offloaded_blocks));
    counter("peregrine:kv_onloaded_blocks", "KV blocks copied from the host tier back to the KV cache.",
            static_cast<double>(s.kv_onloaded_blocks));
    counter("peregrine:kv_offloaded_bytes", "Bytes copied from the KV cache to the host tier.",
            static_cast<double>(s.kv_offloaded_blocks * s.kv_block_bytes));
    counter("peregrine:kv_onloaded_bytes", "Bytes copied from the host tier back to the KV cache.",
            static_cast<double>(s.kv_onloaded_blocks * s.kv_block_bytes));
    gauge("peregrine:host_kv_cache_usage_perc", "Host-tier usage. 1 means 100 percent usage.",
          s.num_host_kv_blocks > 0 ? static_cast<double>(s.num_host_kv_blocks_used) / s.num_host_kv_blocks : 0.0);
    gauge("peregrine:host_kv_cache_blocks", "Blocks the host tier holds at most.", s.num_host_kv_blocks);
    // The disk tier (--kv-offload-disk); zeros without one. Its hits are read back into the host
    // tier, so they are counted again as host hits when the prompt is admitted.
    counter("peregrine:disk_prefix_cache_queries",
            "Disk-tier prefix cache queries, in tokens (prompt tokens after the last KV-cache and host-tier hit).",
            static_cast<double>(s.disk_prefix_queries));
    counter("peregrine:disk_prefix_cache_hits", "Disk-tier prefix cache hits, in tokens (read back to the host tier).",
            static_cast<double>(s.disk_prefix_hits));
    counter("peregrine:disk_kv_evictions", "Blocks dropped from the disk tier to make room for others.",
            static_cast<double>(s.disk_evictions));
    counter("peregrine:kv_disk_written_blocks", "KV blocks written from the host tier to the disk tier.",
            static_cast<double>(s.kv_disk_written_blocks));
    counter("peregrine:kv_disk_read_blocks", "KV blocks read from the disk tier back to the host tier.",
            static_cast<double>(s.kv_disk_read_blocks));
    counter("peregrine:kv_disk_written_bytes", "Bytes of KV blocks written to the disk tier (good writes).",
            static_cast<double>(s.kv_disk_written_bytes));
    counter("peregrine:kv_disk_read_bytes", "Bytes of KV blocks read from the disk tier (good reads).",
            static_cast<double>(s.kv_disk_read_bytes));
    counter("peregrine:disk_kv_write_failures", "Disk-tier writes that failed or were skipped (block dropped).",
            static_cast<double>(s.disk_write_failures));
    counter("peregrine:disk_kv_read_failures", "Disk-tier reads that failed (block dropped and recomputed).",
            static_cast<double>(s.disk_read_failures));
    gauge("peregrine:disk_kv_cache_usage_perc", "Disk-tier usage. 1 means 100 percent usage.",
          s.num_disk_kv_blocks > 0 ? static_cast<double>(s.num_disk_kv_blocks_used) / s.num_disk_kv_blocks : 0.0);
    gauge("peregrine:disk_kv_cache_blocks", "Blocks the disk tier holds at most.", s.num_disk_kv_blocks);
    gauge("peregrine:disk_kv_cache_used_bytes", "Bytes of the disk tier's file holding blocks.",
          static_cast<double>(static_cast<uint64_t>(s.num_disk_kv_blocks_used) * s.disk_slot_bytes));
    counter("peregrine:num_preemptions", "Cumulative number of preemptions from the engine.",
            static_cast<double>(s.preemptions));
    // Swap preemption (--preemption-mode swap): those copies are also in kv_{off,on}loaded_*.
    counter("peregrine:num_swap_preemptions",
            "Preemptions whose KV blocks went to the host tier (the others are recomputed).",
            static_cast<double>(s.swap_preemptions));
    counter("peregrine:kv_swapped_out_bytes", "Bytes of preempted sequences' KV blocks copied to the host tier.",
            static_cast<double>(s.kv_swapped_out_blocks * s.kv_block_bytes));
    counter("peregrine:kv_swapped_in_bytes", "Bytes of resumed sequences' KV blocks copied back from the host tier.",
            static_cast<double>(s.kv_swapped_in_blocks * s.kv_block_bytes));
    counter("peregrine:conversation_requests",
            "Requests naming a conversation (prompt_cache_key or X-Session-ID): its blocks are evicted last.",
            static_cast<double>(s.conversation_requests));
    counter("peregrine:prompt_tokens", "Number of prefill tokens processed.", static_cast<double>(s.prompt_tokens));
    counter("peregrine:generation_tokens", "Number of generation tokens processed.",
            static_cast<double>(s.generation_tokens));

    std::lock_guard lock(mu_);
    w.header("peregrine:request_success_total", "counter", "Count of successfully processed requests.");
    w.sample("peregrine:request_success_total", with_label(model, "finished_reason=\"stop\""),
             static_cast<double>(success_stop_));
    w.sample("peregrine:request_success_total", with_label(model, "finished_reason=\"length\""),
             static_cast<double>(success_length_));
    w.sample("peregrine:request_success_total", with_label(model, "finished_reason=\"abort\""),
             static_cast<double>(success_abort_));
    auto hist = [&](const char* name, const char* help, const Histogram& h) {
        w.header(name, "histogram", help);
        w.histogram(name, model, h);
    };
    hist("peregrine:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft_);
    hist("peregrine:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl_);
    hist("peregrine:e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.", e2e_);
    hist("peregrine:request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds.", queue_);
    hist("peregrine:request_prompt_tokens", "Number of prefill tokens processed, per request.", prompt_tokens_);
    hist("peregrine:request_generation_tokens", "Number of generation tokens processed, per request.",
         generation_tokens_);
    hist("peregrine:request_max_num_generation_tokens",
         "Generation tokens of each request's longest choice (vLLM's max_num_generation_tokens).",
         max_generation_tokens_);
    hist("peregrine:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", prefill_);
    hist("peregrine:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", decode_);
    hist("peregrine:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
         inference_);
    hist("peregrine:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
         tpot_);
    return w.text();
}

}  // namespace peregrine::server
