#include "bench/serve_bench.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without including it

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"

namespace peregrine::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// --- SSE ---------------------------------------------------------------------------------------

std::vector<std::string> SseSplitter::feed(std::string_view bytes) {
    buf_.append(bytes);
    std::vector<std::string> events;
    size_t start = 0;
    for (;;) {
        // An event ends at a blank line: "\n\n" (also "\r\n\r\n" once '\r' is dropped below).
        size_t end = std::string::npos, next = 0;
        for (size_t i = start; i + 1 < buf_.size(); ++i) {
            if (buf_[i] != '\n') continue;
            if (buf_[i + 1] == '\n') {
                end = i, next = i + 2;
                break;
            }
            if (buf_[i + 1] == '\r' && i + 2 < buf_.size() && buf_[i + 2] == '\n') {
                end = i, next = i + 3;
                break;
            }
        }
        if (end == std::string::npos) break;
        std::string data;
        bool any = false;
        size_t pos = start;
        while (pos <= end) {
            size_t nl = buf_.find('\n', pos);
            if (nl == std::string::npos || nl > end) nl = end;
            std::string_view line(buf_.data() + pos, nl - pos);
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            if (line.starts_with("data:")) {
                line.remove_prefix(5);
                if (line.starts_with(' ')) line.remove_prefix(1);
                if (any) data += '\n';
                data.append(line);
                any = true;
            }
            pos = nl + 1;
        }
        if (any) events.push_back(std::move(data));
        start = next;
    }
    buf_.erase(0, start);
    return events;
}

bool SseSplitter::has_partial() const {
    return buf_.find_first_not_of("\r\n") != std::string::npos;
}

void StreamTracker::on_event(const std::string& data, double now) {
    if (failed()) return;
    if (done_) return;  // nothing counts after [DONE]
    if (data == "[DONE]") {
        done_ = true;
        return;
    }
    Json j = Json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        error_kind_ = "malformed_sse";
        error_ = "event is not a JSON object: " + data.substr(0, 200);
        return;
    }
    if (j.contains("error")) {
        error_kind_ = "error_event";
        error_ = "error event: " + data.substr(0, 300);
        return;
    }
    auto choices = j.find("choices");
    if (choices != j.end() && choices->is_array()) {
        for (const Json& c : *choices) {
            const Json* content = nullptr;
            if (chat_) {
                auto d = c.find("delta");
                if (d != c.end() && d->is_object()) {
                    auto t = d->find("content");
                    if (t != d->end()) content = &*t;
                }
            } else {
                auto t = c.find("text");
                if (t != c.end()) content = &*t;
            }
            if (!content || !content->is_string() || content->get_ref<const std::string&>().empty()) continue;
            if (keep_text_) text_ += content->get_ref<const std::string&>();
            if (!seen_content_) {
                seen_content_ = true;
                first_ = now;
            } else {
                itl_.push_back(now - last_);
            }
            last_ = now;
            ++chunks_;
        }
    }
    auto usage = j.find("usage");
    if (usage != j.end() && usage->is_object()) {
        prompt_tokens_ = usage->value("prompt_tokens", int64_t{0});
        output_tokens_ = usage->value("completion_tokens", int64_t{0});
        had_usage_ = true;
    }
}

void StreamTracker::finish(double now, RequestResult& r) {
    r.e2e = now;
    if (!failed() && !done_) {
        error_kind_ = "missing_done";
        error_ = "the stream ended without data: [DONE]";
    }
    r.ok = !failed();
    r.error_kind = error_kind_;
    r.error = error_;
    r.ttft = seen_content_ ? first_ : now;
    r.itl = std::move(itl_);
    r.had_usage = had_usage_;
    r.prompt_tokens = prompt_tokens_;
    r.output_tokens = had_usage_ ? output_tokens_ : chunks_;
    r.text = std::move(text_);
}

// --- multi-turn conversations ------------------------------------------------------------------

namespace {

constexpr const char* kUserTag = "\n\nUser: ";
constexpr const char* kAssistantTag = "\n\nAssistant:";

}  // namespace

std::string Conversation::prompt(size_t k) const {
    if (k >= user_texts.size() || answers.size() < k) fail("bench serve: turn ", k, " has no earlier answers");
    std::string p = system_prompt;
    for (size_t j = 0; j <= k; ++j) {
        p += kUserTag;
        p += user_texts[j];
        p += kAssistantTag;
        if (j < k) p += answers[j];
    }
    return p;
}

nlohmann::json Conversation::messages(size_t k) const {
    if (k >= user_texts.size() || answers.size() < k) fail("bench serve: turn ", k, " has no earlier answers");
    Json m = Json::array();
    m.push_back({{"role", "system"}, {"content", system_prompt}});
    for (size_t j = 0; j <= k; ++j) {
        m.push_back({{"role", "user"}, {"content", user_texts[j]}});
        if (j < k) m.push_back({{"role", "assistant"}, {"content", answers[j]}});
    }
    return m;
}

// --- Prometheus counters -----------------------------------------------------------------------

PrefixCacheCounters parse_prefix_cache_counters(std::string_view text) {
    // [0]: vllm:, [1]: peregrine:; hits, queries.
    double hits[2] = {0, 0}, queries[2] = {0, 0};
    bool seen_hits[2] = {false, false}, seen_queries[2] = {false, false};
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) nl = text.size();
        std::string_view line = text.substr(pos, nl - pos);
        pos = nl + 1;
        while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
        if (line.empty() || line.front() == '#') continue;
        size_t name_end = line.find_first_of("{ \t");
        if (name_end == std::string_view::npos) continue;
        const std::string_view name = line.substr(0, name_end);
        int family = -1;
        if (name == "vllm:prefix_cache_hits_total" || name == "vllm:prefix_cache_queries_total") family = 0;
        if (name == "peregrine:prefix_cache_hits_total" || name == "peregrine:prefix_cache_queries_total") family = 1;
        if (family < 0) continue;
        const bool is_hits = name.ends_with("_hits_total");
        size_t rest = name_end;
        if (line[rest] == '{') {  // skip the labels; values are quoted and may hold '}' or escapes
            bool quoted = false;
            size_t i = rest + 1;
            for (; i < line.size(); ++i) {
                const char c = line[i];
                if (quoted) {
                    if (c == '\\')
                        ++i;
                    else if (c == '"')
                        quoted = false;
                } else if (c == '"') {
                    quoted = true;
                } else if (c == '}') {
                    break;
                }
            }
            if (i >= line.size()) continue;
            rest = i + 1;
        }
        std::string_view value = line.substr(rest);
        while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
        const size_t value_end = value.find_first_of(" \t\r");
        const std::string v(value.substr(0, value_end));  // a timestamp may follow
        if (v.empty()) continue;
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (end != v.c_str() + v.size() || !std::isfinite(x)) continue;
        if (is_hits) {
            hits[family] += x;
            seen_hits[family] = true;
        } else {
            queries[family] += x;
            seen_queries[family] = true;
        }
    }
    PrefixCacheCounters c;
    for (int f = 0; f < 2; ++f) {
        if (seen_hits[f] && seen_queries[f]) {
            c.found = true;
            c.hits = hits[f];
            c.queries = queries[f];
            break;
        }
    }
    return c;
}

void PrefixCacheStats::add(const PrefixCacheCounters& before, const PrefixCacheCounters& after) {
    if (!before.found || !after.found) return;
    const bool reset = after.hits < before.hits || after.queries < before.queries;
    hits += reset ? after.hits : after.hits - before.hits;
    queries += reset ? after.queries : after.queries - before.queries;
    ++servers_read;
}

std::optional<double> PrefixCacheStats::hit_rate() const {
    if (servers_read == 0 || queries <= 0) return std::nullopt;
    return hits / queries;
}

// --- statistics --------------------------------------------------------------------------------

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double rank = q / 100.0 * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(rank));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    const double frac = rank - static_cast<double>(lo);
    return v[lo] + (v[hi] - v[lo]) * frac;
}

Distribution distribution(const std::vector<double>& v) {
    Distribution d;
    if (v.empty()) return d;
    double sum = 0;
    for (double x : v) sum += x;
    d.mean = sum / static_cast<double>(v.size());
    double sq = 0;
    for (double x : v) sq += (x - d.mean) * (x - d.mean);
    d.std = std::sqrt(sq / static_cast<double>(v.size()));
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    d.median = percentile(s, 50);
    d.p90 = percentile(s, 90);
    d.p99 = percentile(s, 99);
    d.max = s.back();
    return d;
}

ServeBenchSummary summarize(const std::vector<RequestResult>& results, double duration_s, int expected_output_len) {
    ServeBenchSummary s;
    s.duration_s = duration_s;
    std::vector<double> ttft, tpot, itl, e2e;
    std::set<std::string> seen_errors;
    std::vector<double> turn_sum;  // multi-turn: TTFT (ms) summed per turn
    std::vector<int64_t> turn_n;
    for (const RequestResult& r : results) {
        if (r.turn >= 0 && turn_sum.size() <= static_cast<size_t>(r.turn)) {
            turn_sum.resize(static_cast<size_t>(r.turn) + 1, 0);
            turn_n.resize(static_cast<size_t>(r.turn) + 1, 0);
        }
        if (!r.ok) {
            ++s.failed;
            ++s.errors[r.error_kind.empty() ? "unknown" : r.error_kind];
            if (s.error_examples.size() < 5 && seen_errors.insert(r.error).second) s.error_examples.push_back(r.error);
            continue;
        }
        ++s.completed;
        s.total_input_tokens += r.prompt_tokens;
        s.total_output_tokens += r.output_tokens;
        if (!r.had_usage) ++s.without_usage;
        if (expected_output_len > 0 && r.output_tokens != expected_output_len) ++s.output_len_mismatches;
        ttft.push_back(r.ttft * 1e3);
        e2e.push_back(r.e2e * 1e3);
        if (r.turn >= 0) {
            turn_sum[static_cast<size_t>(r.turn)] += r.ttft * 1e3;
            ++turn_n[static_cast<size_t>(r.turn)];
        }
        if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) * 1e3 / static_cast<double>(r.output_tokens - 1));
        for (double x : r.itl) itl.push_back(x * 1e3);
    }
    if (duration_s > 0) {
        s.request_throughput = static_cast<double>(s.completed) / duration_s;
        s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_s;
        s.total_token_throughput = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_s;
    }
    s.ttft_ms = distribution(ttft);
    s.tpot_ms = distribution(tpot);
    s.itl_ms = distribution(itl);
    s.e2e_ms = distribution(e2e);
    double later_sum = 0;
    int64_t later_n = 0;
    for (size_t t = 0; t < turn_sum.size(); ++t) {
        s.ttft_ms_by_turn.push_back(turn_n[t] > 0 ? std::optional<double>(turn_sum[t] / static_cast<double>(turn_n[t]))
                                                  : std::nullopt);
        if (t > 0) later_sum += turn_sum[t], later_n += turn_n[t];
    }
    if (!s.ttft_ms_by_turn.empty()) s.ttft_ms_first_turn = s.ttft_ms_by_turn[0];
    if (later_n > 0) s.ttft_ms_later_turns = later_sum / static_cast<double>(later_n);
    return s;
}

namespace {

void line(std::string& out, const char* label, const std::string& value) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%-40s%s\n", label, value.c_str());
    out += buf;
}
std::string num(double x, int digits = 2) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, x);
    return buf;
}
void rule(std::string& out, const char* title, char fill) {
    const int width = 50;
    const int len = static_cast<int>(std::string_view(title).size());
    const int left = std::max(0, (width - len) / 2);
    const int right = std::max(0, width - len - left);
    out += std::string(left, fill) + title + std::string(right, fill) + "\n";
}
void dist_lines(std::string& out, const char* name, const Distribution& d) {
    const std::string n = name;
    line(out, ("Mean " + n + " (ms):").c_str(), num(d.mean));
    line(out, ("Median " + n + " (ms):").c_str(), num(d.median));
    line(out, ("P90 " + n + " (ms):").c_str(), num(d.p90));
    line(out, ("P99 " + n + " (ms):").c_str(), num(d.p99));
}
void dist_json(Json& j, const char* name, const Distribution& d) {
    const std::string n = name;
    j["mean_" + n + "_ms"] = d.mean;
    j["median_" + n + "_ms"] = d.median;
    j["std_" + n + "_ms"] = d.std;
    j["p90_" + n + "_ms"] = d.p90;
    j["p99_" + n + "_ms"] = d.p99;
    j["max_" + n + "_ms"] = d.max;
}

}  // namespace

std::string format_summary(const ServeBenchSummary& s, const ServeBenchOptions& o) {
    std::string out;
    rule(out, " Serving Benchmark Result ", '=');
    const bool multi_turn = o.dataset == "multi-turn";
    line(out, "Endpoint:", "/v1/" + std::string(o.endpoint == "chat" ? "chat/completions" : "completions"));
    if (multi_turn)
        line(out, "Dataset:",
             "multi-turn (" + std::to_string(o.num_users) + " users x " + std::to_string(o.turns) + " turns)");
    line(out, "Concurrency:", std::to_string(o.concurrency));
    line(out, "Request rate (req/s):", o.request_rate > 0 ? num(o.request_rate) : std::string("inf"));
    line(out, "Successful requests:", std::to_string(s.completed));
    line(out, "Failed requests:", std::to_string(s.failed));
    line(out, "Benchmark duration (s):", num(s.duration_s));
    line(out, "Total input tokens:", std::to_string(s.total_input_tokens));
    line(out, "Total generated tokens:", std::to_string(s.total_output_tokens));
    line(out, "Request throughput (req/s):", num(s.request_throughput));
    line(out, "Output token throughput (tok/s):", num(s.output_throughput));
    line(out, "Total token throughput (tok/s):", num(s.total_token_throughput));
    rule(out, "Time to First Token", '-');
    dist_lines(out, "TTFT", s.ttft_ms);
    if (multi_turn) {
        auto opt = [](const std::optional<double>& x) { return x ? num(*x) : std::string("n/a"); };
        line(out, "Mean TTFT turn 1 (ms):", opt(s.ttft_ms_first_turn));
        line(out, "Mean TTFT turns 2+ (ms):", opt(s.ttft_ms_later_turns));
    }
    rule(out, "Time per Output Token (excl. 1st token)", '-');
    dist_lines(out, "TPOT", s.tpot_ms);
    rule(out, "Inter-token Latency", '-');
    dist_lines(out, "ITL", s.itl_ms);
    rule(out, "End-to-end Latency", '-');
    dist_lines(out, "E2E", s.e2e_ms);
    rule(out, "Prefix Cache", '-');
    const PrefixCacheStats& pc = s.prefix_cache;
    const std::optional<double> rate = pc.hit_rate();
    std::string rate_text = rate ? num(*rate * 100) + "%" : "n/a";
    if (!rate) rate_text += pc.servers_read == 0 ? " (no metrics read)" : " (no prefix-cache queries)";
    line(out, "Prefix cache hit rate:", rate_text);
    if (pc.servers_read > 0) {
        line(out, "Prefix cache hits (tokens):", num(pc.hits, 0));
        line(out, "Prefix cache queries (tokens):", num(pc.queries, 0));
    }
    line(out, "Metrics read (servers):", std::to_string(pc.servers_read) + "/" + std::to_string(pc.urls.size()));
    for (const std::string& e : pc.errors) out += "  metrics: " + e + "\n";
    if (s.failed > 0 || s.output_len_mismatches > 0 || s.without_usage > 0) {
        rule(out, "Problems", '-');
        for (const auto& [kind, n] : s.errors) line(out, ("Failed (" + kind + "):").c_str(), std::to_string(n));
        if (s.output_len_mismatches > 0)
            line(out, "Output length != --output-len:", std::to_string(s.output_len_mismatches));
        if (s.without_usage > 0) line(out, "No usage chunk (chunks counted):", std::to_string(s.without_usage));
        for (const std::string& e : s.error_examples) out += "  e.g. " + e + "\n";
    }
    rule(out, "", '=');
    return out;
}

Json summary_json(const ServeBenchSummary& s, const ServeBenchOptions& o) {
    Json j;
    j["endpoint"] = o.endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";
    j["url"] = o.url;
    j["model"] = o.model;
    j["num_requests"] = o.num_requests;
    j["concurrency"] = o.concurrency;
    j["request_rate"] = o.request_rate > 0 ? Json(o.request_rate) : Json("inf");
    j["prompt_len"] = o.prompt_len;
    j["output_len"] = o.output_len;
    j["prompt_kind"] = o.prompt_kind;
    j["seed"] = o.seed;
    j["completed"] = s.completed;
    j["failed"] = s.failed;
    j["duration"] = s.duration_s;
    j["total_input_tokens"] = s.total_input_tokens;
    j["total_output_tokens"] = s.total_output_tokens;
    j["request_throughput"] = s.request_throughput;
    j["output_throughput"] = s.output_throughput;
    j["total_token_throughput"] = s.total_token_throughput;
    dist_json(j, "ttft", s.ttft_ms);
    dist_json(j, "tpot", s.tpot_ms);
    dist_json(j, "itl", s.itl_ms);
    dist_json(j, "e2el", s.e2e_ms);
    j["output_len_mismatches"] = s.output_len_mismatches;
    j["without_usage"] = s.without_usage;
    j["errors"] = s.errors;
    j["error_examples"] = s.error_examples;
    j["dataset"] = o.dataset;
    if (o.dataset == "multi-turn") {
        j["num_users"] = o.num_users;
        j["turns"] = o.turns;
        j["system_prompt_len"] = o.system_prompt_len;
        j["turn_len"] = o.turn_len;
        j["turn_order"] = o.turn_order;
        auto opt = [](const std::optional<double>& x) { return x ? Json(*x) : Json(nullptr); };
        Json by_turn = Json::array();  // [i]: turn i + 1
        for (const auto& t : s.ttft_ms_by_turn) by_turn.push_back(opt(t));
        j["ttft_ms_by_turn"] = by_turn;
        j["mean_ttft_ms_first_turn"] = opt(s.ttft_ms_first_turn);
        j["mean_ttft_ms_later_turns"] = opt(s.ttft_ms_later_turns);
    }
    const std::optional<double> rate = s.prefix_cache.hit_rate();
    j["prefix_cache_hit_rate"] = rate ? Json(*rate) : Json(nullptr);
    j["prefix_cache_hits"] = s.prefix_cache.hits;
    j["prefix_cache_queries"] = s.prefix_cache.queries;
    j["prefix_cache_servers_read"] = s.prefix_cache.servers_read;
    j["metrics_urls"] = s.prefix_cache.urls;
    j["metrics_errors"] = s.prefix_cache.errors;
    return j;
}

// --- the client --------------------------------------------------------------------------------

namespace {

struct Target {
    std::string host, port, prefix;
};

Target parse_url(const std::string& url) {
    std::string_view u = url;
    if (u.starts_with("https://")) fail("bench serve: https is not supported (", url, ")");
    if (u.starts_with("http://")) u.remove_prefix(7);
    const size_t slash = u.find('/');
    std::string_view hostport = u.substr(0, slash);
    std::string prefix = slash == std::string_view::npos ? "" : std::string(u.substr(slash));
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    if (prefix.ends_with("/v1")) prefix.resize(prefix.size() - 3);
    Target t;
    t.prefix = prefix;
    if (hostport.starts_with('[')) {  // [v6]:port
        const size_t close = hostport.find(']');
        if (close == std::string_view::npos) fail("bench serve: bad URL '", url, "'");
        t.host = std::string(hostport.substr(1, close - 1));
        hostport.remove_prefix(close + 1);
        t.port = hostport.starts_with(':') ? std::string(hostport.substr(1)) : "80";
    } else {
        const size_t colon = hostport.rfind(':');
        t.host = std::string(hostport.substr(0, colon));
        t.port = colon == std::string_view::npos ? "80" : std::string(hostport.substr(colon + 1));
    }
    if (t.host.empty() || t.port.empty()) fail("bench serve: bad URL '", url, "'");
    return t;
}

// Short common words: a random-word prompt costs roughly one token per word on most vocabularies.
constexpr const char* kWords[] = {
    "the",   "a",     "little", "girl",  "boy",   "dog",  "cat",  "saw",   "big",   "red",  "ball",  "tree",
    "house", "happy", "sad",    "went",  "park",  "play", "with", "her",   "his",   "mom",  "dad",   "and",
    "they",  "were",  "friend", "sun",   "sky",   "blue", "bird", "fish",  "water", "run",  "jump",  "day",
    "one",   "time",  "there",  "was",   "said",  "look", "find", "toy",   "box",   "car",  "good",  "nice",
    "small", "funny", "cake",   "apple", "green", "hat",  "bed",  "night", "moon",  "star", "smile", "help"};

std::string random_words(std::mt19937_64& rng, int n) {
    std::uniform_int_distribution<size_t> word_dist(0, std::size(kWords) - 1);
    std::string text;
    for (int k = 0; k < n; ++k) {
        if (k) text += ' ';
        text += kWords[word_dist(rng)];
    }
    return text;
}

// The JSON body of one streamed request; `prompt` is the prompt (completions) or the messages (chat).
std::string request_body(const ServeBenchOptions& o, bool chat, Json prompt) {
    Json j;
    j["model"] = o.model;
    if (chat) {
        j["messages"] = std::move(prompt);
    } else {
        j["prompt"] = std::move(prompt);
    }
    j["max_tokens"] = o.output_len;
    j["ignore_eos"] = true;
    j["temperature"] = o.temperature;
    j["stream"] = true;
    j["stream_options"] = {{"include_usage", true}};
    return j.dump();
}

std::vector<std::string> build_bodies(const ServeBenchOptions& o, bool ids) {
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<int> id_dist(o.token_id_min, o.token_id_max);
    const bool chat = o.endpoint == "chat";
    std::vector<std::string> bodies;
    bodies.reserve(static_cast<size_t>(o.num_requests));
    for (int i = 0; i < o.num_requests; ++i) {
        Json prompt;
        if (ids) {
            prompt = Json::array();
            for (int k = 0; k < o.prompt_len; ++k) prompt.push_back(id_dist(rng));
        } else {
            prompt = random_words(rng, o.prompt_len);
        }
        if (chat) prompt = Json::array({Json{{"role", "user"}, {"content", std::move(prompt)}}});
        bodies.push_back(request_body(o, chat, std::move(prompt)));
    }
    return bodies;
}

}  // namespace

std::vector<Conversation> build_conversations(const ServeBenchOptions& o) {
    std::mt19937_64 system_rng(o.seed ^ 0x5bd1e995ull);
    const std::string system_prompt = random_words(system_rng, o.system_prompt_len);
    std::vector<Conversation> users(static_cast<size_t>(std::max(0, o.num_users)));
    for (size_t u = 0; u < users.size(); ++u) {
        // Each user's words depend only on (seed, user), not on the order the users run in.
        std::seed_seq seq{static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32), static_cast<uint32_t>(u),
                          0x75736572u};
        std::mt19937_64 rng(seq);
        users[u].system_prompt = system_prompt;
        for (int k = 0; k < o.turns; ++k) users[u].user_texts.push_back(random_words(rng, o.turn_len));
    }
    return users;
}

namespace {

struct Run {
    explicit Run(const ServeBenchOptions& opts) : o(opts), target(parse_url(opts.url)) {}
    const ServeBenchOptions& o;
    Target target;
    tcp::resolver::results_type endpoints;
    std::vector<std::string> bodies;          // random
    std::vector<Conversation> conversations;  // multi-turn
    std::vector<double> arrivals;             // seconds after start, when request_rate > 0
    std::vector<RequestResult> results;       // multi-turn: user u's turn k at u * turns + k
    Clock::time_point start;
    std::atomic<int> next{0};  // the next request (random) or user (multi-turn) to start
    std::atomic<int> finished{0};
    bool progress = false;
    int last_progress_pct = -1;
    bool chat = false;

    void note_finished() {
        const int done = ++finished;
        if (!progress) return;
        const int pct = static_cast<int>(int64_t{done} * 100 / o.num_requests);
        std::lock_guard lock(progress_mu);
        if (pct / 10 != last_progress_pct / 10) {
            last_progress_pct = pct;
            std::fprintf(stderr, "  %d/%d requests done (%.1f s)\n", done, o.num_requests,
                         std::chrono::duration<double>(Clock::now() - start).count());
        }
    }
    std::mutex progress_mu;
};

http::request<http::string_body> make_request(const Target& t, http::verb verb, const std::string& path,
                                              const std::string& api_key, std::string body) {
    http::request<http::string_body> req{verb, t.prefix + path, 11};
    req.set(http::field::host, t.host + ":" + t.port);
    req.set(http::field::user_agent, "peregrine-bench-serve");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    req.keep_alive(true);
    if (verb == http::verb::post) {
        req.set(http::field::content_type, "application/json");
        req.set(http::field::accept, "text/event-stream");
        req.body() = std::move(body);
    }
    req.prepare_payload();
    return req;
}

std::string io_kind(const beast::error_code& ec) {
    return ec == beast::error::timeout ? "timeout" : "io";
}

// One worker's keep-alive connection.
struct Connection {
    explicit Connection(const asio::any_io_executor& ex) : stream(ex), body_storage(16384) {}
    beast::tcp_stream stream;
    beast::flat_buffer buffer;
    bool connected = false;
    std::vector<char> body_storage;  // per worker: another worker's read may complete before this one resumes

    void close() {
        if (!connected) return;
        beast::error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
        stream.socket().close(ignored);
        buffer.clear();
        connected = false;
    }
};

// Sends one streamed request on `c` (connecting first if needed) and fills in `r`.
asio::awaitable<void> send_request(Run& run, Connection& c, const std::string& body, RequestResult& r, bool keep_text) {
    const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(run.o.timeout_s));
    const std::string path = run.chat ? "/v1/chat/completions" : "/v1/completions";
    char* const body_buf = c.body_storage.data();
    const size_t body_cap = c.body_storage.size();
    beast::error_code ec;
    const auto t0 = Clock::now();
    auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    auto fail_io = [&](const char* what) {
        r.ok = false;
        r.error_kind = io_kind(ec);
        r.error = std::string(what) + ": " + ec.message();
        r.e2e = since();
        beast::error_code ignored;
        c.stream.socket().close(ignored);
        c.buffer.clear();
        c.connected = false;
    };
    if (!c.connected) {
        c.stream.expires_after(timeout);
        co_await c.stream.async_connect(run.endpoints, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) {
            fail_io("connect");
            r.error_kind = "connect";
            co_return;
        }
        c.stream.socket().set_option(tcp::no_delay(true), ec);
        c.connected = true;
    }
    auto req = make_request(run.target, http::verb::post, path, run.o.api_key, body);
    c.stream.expires_after(timeout);
    co_await http::async_write(c.stream, req, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
        fail_io("write");
        co_return;
    }
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // not boost::none: 1.74 compares a length > none
    co_await http::async_read_header(c.stream, c.buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
        fail_io("read header");
        co_return;
    }
    const int status = parser.get().result_int();
    StreamTracker tracker(run.chat, keep_text);
    SseSplitter sse;
    std::string error_body;
    while (!parser.is_done()) {
        parser.get().body().data = body_buf;
        parser.get().body().size = body_cap;
        co_await http::async_read_some(c.stream, c.buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
        if (ec == http::error::need_buffer) ec = {};
        if (ec) break;
        const size_t n = body_cap - parser.get().body().size;
        if (n == 0) continue;
        const double now = since();
        if (status != 200) {
            if (error_body.size() < 400) error_body.append(body_buf, std::min(n, 400 - error_body.size()));
            continue;
        }
        for (const std::string& ev : sse.feed(std::string_view(body_buf, n))) tracker.on_event(ev, now);
    }
    if (ec) {
        fail_io("read body");
        co_return;
    }
    if (status != 200) {
        r.ok = false;
        r.error_kind = "http_" + std::to_string(status);
        r.error = "HTTP " + std::to_string(status) + ": " + error_body;
        r.e2e = since();
    } else {
        tracker.finish(since(), r);
        if (r.ok && sse.has_partial()) {
            r.ok = false;
            r.error_kind = "malformed_sse";
            r.error = "the stream ended inside an event";
        }
    }
    if (!parser.get().keep_alive()) c.close();
}

// random: takes the next request until none is left.
asio::awaitable<void> random_worker(Run& run) {
    auto ex = co_await asio::this_coro::executor;
    Connection c(ex);
    for (;;) {
        const int i = run.next++;
        if (i >= run.o.num_requests) break;
        if (!run.arrivals.empty()) {
            asio::steady_timer timer(ex);
            timer.expires_at(run.start + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(run.arrivals[static_cast<size_t>(i)])));
            beast::error_code ignored;
            co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
        }
        co_await send_request(run, c, run.bodies[static_cast<size_t>(i)], run.results[static_cast<size_t>(i)], false);
        run.note_finished();
    }
    c.close();
}

// Plays one turn of user `u` on `c`; false when it failed (the conversation cannot go on).
asio::awaitable<bool> play_turn(Run& run, Connection& c, size_t u, size_t k) {
    Conversation& conv = run.conversations[u];
    RequestResult& r = run.results[u * static_cast<size_t>(run.o.turns) + k];
    r.turn = static_cast<int>(k);
    const std::string body = request_body(run.o, run.chat, run.chat ? conv.messages(k) : Json(conv.prompt(k)));
    co_await send_request(run, c, body, r, /*keep_text=*/true);
    const bool ok = r.ok;
    if (ok) conv.answers.push_back(std::move(r.text));
    r.text.clear();
    run.note_finished();
    co_return ok;
}

// The turns of user u after turn `failed` cannot be sent without its answer.
void skip_rest(Run& run, size_t u, size_t failed) {
    const size_t turns = static_cast<size_t>(run.o.turns);
    for (size_t k = failed + 1; k < turns; ++k) {
        RequestResult& r = run.results[u * turns + k];
        r.turn = static_cast<int>(k);
        r.ok = false;
        r.error_kind = "previous_turn_failed";
        r.error = "an earlier turn of the same user failed";
        run.note_finished();
    }
}

// multi-turn, sequential: takes the next user and plays all its turns in order.
asio::awaitable<void> multi_turn_worker(Run& run) {
    auto ex = co_await asio::this_coro::executor;
    Connection c(ex);
    const size_t turns = static_cast<size_t>(run.o.turns);
    for (;;) {
        const int next_user = run.next++;
        if (next_user >= run.o.num_users) break;
        const size_t u = static_cast<size_t>(next_user);
        for (size_t k = 0; k < turns; ++k) {
            if (!co_await play_turn(run, c, u, k)) {
                skip_rest(run, u, k);
                break;
            }
        }
    }
    c.close();
}

// The `concurrency` keep-alive connections, handed to waiting users first come, first served
// (one thread: the bench's io_context runs on the calling thread only).
class ConnectionPool {
  public:
    ConnectionPool(const asio::any_io_executor& ex, int n) {
        for (int i = 0; i < n; ++i) all_.push_back(std::make_unique<Connection>(ex));
        for (auto& c : all_) free_.push_back(c.get());
    }
    asio::awaitable<Connection*> acquire() {
        if (!free_.empty() && waiting_.empty()) {
            Connection* c = free_.back();
            free_.pop_back();
            co_return c;
        }
        auto w = std::make_shared<Waiter>(co_await asio::this_coro::executor);
        waiting_.push_back(w);
        beast::error_code ignored;  // cancelled by release(), which filled in w->got
        co_await w->timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
        co_return w->got;
    }
    void release(Connection* c) {
        if (waiting_.empty()) {
            free_.push_back(c);
            return;
        }
        const std::shared_ptr<Waiter> w = waiting_.front();
        waiting_.pop_front();
        w->got = c;
        w->timer.cancel();
    }
    void close_all() {
        for (auto& c : all_) c->close();
    }

  private:
    struct Waiter {
        explicit Waiter(const asio::any_io_executor& ex) : timer(ex, asio::steady_timer::time_point::max()) {}
        asio::steady_timer timer;
        Connection* got = nullptr;
    };
    std::vector<std::unique_ptr<Connection>> all_;
    std::vector<Connection*> free_;
    std::deque<std::shared_ptr<Waiter>> waiting_;
};

// multi-turn, interleaved: user u sends each turn once a connection is free, then queues again
// behind the users already waiting.
asio::awaitable<void> multi_turn_user(Run& run, ConnectionPool& pool, size_t u) {
    const size_t turns = static_cast<size_t>(run.o.turns);
    for (size_t k = 0; k < turns; ++k) {
        Connection* c = co_await pool.acquire();
        const bool ok = co_await play_turn(run, *c, u, k);
        pool.release(c);
        if (!ok) {
            skip_rest(run, u, k);
            break;
        }
    }
}

// GET `path` with a deadline; status 0 and `error` set when no response came.
asio::awaitable<void> http_get(const tcp::resolver::results_type& endpoints, const Target& t, std::string path,
                               const std::string& api_key, std::chrono::seconds timeout, int& status, std::string& body,
                               std::string& error) {
    auto ex = co_await asio::this_coro::executor;
    beast::tcp_stream stream(ex);
    beast::error_code ec;
    stream.expires_after(timeout);
    co_await stream.async_connect(endpoints, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
        error = "connect: " + ec.message();
        co_return;
    }
    auto req = make_request(t, http::verb::get, path, api_key, "");
    req.keep_alive(false);
    co_await http::async_write(stream, req, asio::redirect_error(asio::use_awaitable, ec));
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    if (!ec) co_await http::async_read(stream, buffer, res, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
        error = "GET " + t.prefix + path + ": " + ec.message();
        co_return;
    }
    status = res.result_int();
    body = std::move(res.body());
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

// GET /v1/models → the first model's id.
asio::awaitable<void> fetch_model(Run& run, std::string& model, std::string& error) {
    int status = 0;
    std::string body;
    co_await http_get(run.endpoints, run.target, "/v1/models", run.o.api_key, std::chrono::seconds(30), status, body,
                      error);
    if (status == 0) co_return;
    if (status != 200) {
        error = "GET /v1/models: HTTP " + std::to_string(status) + ": " + body.substr(0, 300);
        co_return;
    }
    Json j = Json::parse(body, nullptr, false);
    if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
        j["data"][0].contains("id") && j["data"][0]["id"].is_string()) {
        model = j["data"][0]["id"].get<std::string>();
    } else {
        error = "GET /v1/models: no model in " + body.substr(0, 300);
    }
}

// A Prometheus endpoint to read the prefix-cache counters from.
struct MetricsSource {
    std::string url;
    Target target;
    std::string path;  // appended to target.prefix
};

MetricsSource metrics_source(const std::string& url) {
    MetricsSource m{"", parse_url(url), "/metrics"};
    if (m.target.prefix.ends_with("/metrics")) m.path.clear();
    const bool v6 = m.target.host.find(':') != std::string::npos;
    m.url =
        "http://" + (v6 ? "[" + m.target.host + "]" : m.target.host) + ":" + m.target.port + m.target.prefix + m.path;
    return m;
}

// Reads every source at once; [i] is nullopt (and errors[i] says why) where the counters were not read.
std::vector<std::optional<PrefixCacheCounters>> scrape(asio::io_context& io, const std::vector<MetricsSource>& sources,
                                                       const std::string& api_key, std::vector<std::string>& errors) {
    const size_t n = sources.size();
    std::vector<std::optional<PrefixCacheCounters>> out(n);
    std::vector<tcp::resolver::results_type> endpoints(n);
    std::vector<int> status(n, 0);
    std::vector<std::string> body(n);
    errors.assign(n, "");
    tcp::resolver resolver(io);
    for (size_t i = 0; i < n; ++i) {
        beast::error_code ec;
        endpoints[i] = resolver.resolve(sources[i].target.host, sources[i].target.port, ec);
        if (ec) {
            errors[i] = "cannot resolve " + sources[i].target.host + ": " + ec.message();
            continue;
        }
        asio::co_spawn(io,
                       http_get(endpoints[i], sources[i].target, sources[i].path, api_key, std::chrono::seconds(10),
                                status[i], body[i], errors[i]),
                       asio::detached);
    }
    io.run();
    io.restart();
    for (size_t i = 0; i < n; ++i) {
        if (!errors[i].empty()) continue;
        if (status[i] != 200) {
            errors[i] = "HTTP " + std::to_string(status[i]);
            continue;
        }
        const PrefixCacheCounters c = parse_prefix_cache_counters(body[i]);
        if (!c.found) {
            errors[i] = "no prefix_cache_hits_total / prefix_cache_queries_total counters";
            continue;
        }
        out[i] = c;
    }
    return out;
}

}  // namespace

ServeBenchSummary run_serve_bench(ServeBenchOptions& o, bool progress) {
    if (o.endpoint != "completions" && o.endpoint != "chat")
        fail("bench serve: --endpoint must be 'completions' or 'chat', not '", o.endpoint, "'");
    if (o.dataset != "random" && o.dataset != "multi-turn")
        fail("bench serve: --dataset must be 'random' or 'multi-turn', not '", o.dataset, "'");
    if (o.prompt_kind != "auto" && o.prompt_kind != "ids" && o.prompt_kind != "words")
        fail("bench serve: --prompt-kind must be 'ids', 'words' or 'auto'");
    if (o.prompt_kind == "ids" && o.endpoint == "chat")
        fail("bench serve: chat prompts are text; use --prompt-kind words");
    if (o.token_id_min < 0 || o.token_id_max < o.token_id_min) fail("bench serve: bad --token-id-range");
    const bool multi_turn = o.dataset == "multi-turn";
    if (multi_turn) {
        if (o.num_users <= 0 || o.turns <= 0) fail("bench serve: --num-users and --turns must be > 0");
        if (o.system_prompt_len < 0 || o.turn_len <= 0)
            fail("bench serve: --system-prompt-len must be >= 0 and --turn-len > 0");
        if (o.prompt_kind == "ids")
            fail("bench serve: multi-turn resends the answers as text; it takes no --prompt-kind ids");
        if (o.request_rate > 0) fail("bench serve: --request-rate is not supported with --dataset multi-turn");
        if (o.turn_order != "interleaved" && o.turn_order != "sequential")
            fail("bench serve: --turn-order must be 'interleaved' or 'sequential', not '", o.turn_order, "'");
        if (int64_t{o.num_users} * o.turns > std::numeric_limits<int>::max())
            fail("bench serve: --num-users x --turns is too large");
        o.prompt_kind = "words";
        o.num_requests = o.num_users * o.turns;
    }
    if (o.num_requests <= 0 || o.concurrency <= 0) fail("bench serve: --num-requests and --concurrency must be > 0");
    if (o.prompt_kind == "auto") o.prompt_kind = o.endpoint == "chat" ? "words" : "ids";

    asio::io_context io(1);
    Run run(o);
    run.chat = o.endpoint == "chat";
    {
        tcp::resolver resolver(io);
        beast::error_code ec;
        run.endpoints = resolver.resolve(run.target.host, run.target.port, ec);
        if (ec) fail("bench serve: cannot resolve ", run.target.host, ":", run.target.port, ": ", ec.message());
    }
    std::vector<MetricsSource> metrics;
    for (const std::string& u : o.metrics_urls.empty() ? std::vector<std::string>{o.url} : o.metrics_urls) {
        MetricsSource m = metrics_source(u);
        const bool dup = std::any_of(metrics.begin(), metrics.end(), [&](const auto& x) { return x.url == m.url; });
        if (!dup) metrics.push_back(std::move(m));  // a server counted twice would skew the sums
    }
    if (o.model.empty()) {
        std::string model, error;
        asio::co_spawn(io, fetch_model(run, model, error), asio::detached);
        io.run();
        io.restart();
        if (model.empty()) fail("bench serve: no --model given and none found at ", o.url, " (", error, ")");
        o.model = model;
    }
    if (multi_turn) {
        run.conversations = build_conversations(o);
    } else {
        run.bodies = build_bodies(o, o.prompt_kind == "ids");
    }
    run.results.resize(static_cast<size_t>(o.num_requests));
    if (o.request_rate > 0) {
        std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ull);
        std::exponential_distribution<double> gap(o.request_rate);
        double t = 0;
        for (int i = 0; i < o.num_requests; ++i) {
            run.arrivals.push_back(t);
            t += gap(rng);
        }
    }
    run.progress = progress;
    const std::string where = "http://" + run.target.host + ":" + run.target.port + run.target.prefix +
                              (run.chat ? "/v1/chat/completions" : "/v1/completions");
    if (progress && multi_turn)
        std::fprintf(stderr,
                     "bench serve: multi-turn, %d users x %d turns (%d requests) to %s (model '%s'), concurrency %d, "
                     "system prompt %d words, %d words a turn, %d tokens out, turns %s\n",
                     o.num_users, o.turns, o.num_requests, where.c_str(), o.model.c_str(), o.concurrency,
                     o.system_prompt_len, o.turn_len, o.output_len, o.turn_order.c_str());
    else if (progress)
        std::fprintf(stderr, "bench serve: %d requests to %s (model '%s'), concurrency %d, %d %s in, %d tokens out\n",
                     o.num_requests, where.c_str(), o.model.c_str(), o.concurrency, o.prompt_len,
                     o.prompt_kind == "ids" ? "token ids" : "words", o.output_len);

    std::vector<std::string> before_errors, after_errors;
    const auto before = scrape(io, metrics, o.api_key, before_errors);

    run.start = Clock::now();
    const int workers = std::min(o.concurrency, multi_turn ? o.num_users : o.num_requests);
    std::optional<ConnectionPool> pool;
    if (multi_turn && o.turn_order == "interleaved") {
        pool.emplace(io.get_executor(), workers);
        for (size_t u = 0; u < run.conversations.size(); ++u)
            asio::co_spawn(io, multi_turn_user(run, *pool, u), asio::detached);
        io.run();
    } else {
        // Worker w runs on thread w % threads, each thread an io_context of its own.
        const int threads =
            multi_turn
                ? 1
                : std::min(workers, o.client_threads > 0
                                        ? o.client_threads
                                        : std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 8));
        std::vector<std::unique_ptr<asio::io_context>> extra;
        for (int t = 1; t < threads; ++t) extra.push_back(std::make_unique<asio::io_context>(1));
        for (int w = 0; w < workers; ++w) {
            asio::io_context& ctx = w % threads == 0 ? io : *extra[static_cast<size_t>(w % threads - 1)];
            asio::co_spawn(ctx, multi_turn ? multi_turn_worker(run) : random_worker(run), asio::detached);
        }
        std::vector<std::thread> pool_threads;
        for (auto& ctx : extra) pool_threads.emplace_back([&ctx] { ctx->run(); });
        io.run();
        for (std::thread& t : pool_threads) t.join();
    }
    if (pool) pool->close_all();
    io.restart();
    const double duration = std::chrono::duration<double>(Clock::now() - run.start).count();

    const auto after = scrape(io, metrics, o.api_key, after_errors);
    ServeBenchSummary s = summarize(run.results, duration, o.output_len);
    for (size_t i = 0; i < metrics.size(); ++i) {
        s.prefix_cache.urls.push_back(metrics[i].url);
        if (before[i] && after[i]) {
            s.prefix_cache.add(*before[i], *after[i]);
        } else {
            const std::string& e = before_errors[i].empty() ? after_errors[i] : before_errors[i];
            s.prefix_cache.errors.push_back(metrics[i].url + ": " + e);
        }
    }
    return s;
}

}  // namespace peregrine::bench
