// `peregrine bench serve`: load-test an OpenAI-compatible server (ours or another engine's) with
// streamed requests and report throughput and latency (bench/serve_bench.h).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench/serve_bench.h"
#include "cli/commands.h"
#include "core/error.h"

namespace peregrine::cli {

namespace {

struct BenchServeArgs {
    bench::ServeBenchOptions opts;
    std::string host;
    int port = 0;
    std::string json_path;
    std::string token_id_range;
    bool quiet = false;
    bool num_requests_given = false, prompt_len_given = false;  // multi-turn rejects them
};

int run_bench_serve(BenchServeArgs& a) {
    bench::ServeBenchOptions& o = a.opts;
    if (!a.host.empty() || a.port > 0) {
        o.url = "http://" + (a.host.empty() ? std::string("127.0.0.1") : a.host) + ":" +
                std::to_string(a.port > 0 ? a.port : 8000);
    }
    if (!a.token_id_range.empty()) {
        const size_t colon = a.token_id_range.find(':');
        try {
            if (colon == std::string::npos) throw std::invalid_argument("no colon");
            o.token_id_min = std::stoi(a.token_id_range.substr(0, colon));
            o.token_id_max = std::stoi(a.token_id_range.substr(colon + 1));
        } catch (const std::exception&) {
            fail("bench serve: --token-id-range takes MIN:MAX, not '", a.token_id_range, "'");
        }
    }
    if (o.dataset == "multi-turn") {
        if (a.num_requests_given)
            fail("bench serve: --dataset multi-turn sends --num-users x --turns requests; drop --num-requests");
        if (a.prompt_len_given) fail("bench serve: --dataset multi-turn takes --turn-len, not --prompt-len");
    }
    if (o.api_key.empty()) {
        if (const char* k = std::getenv("OPENAI_API_KEY")) o.api_key = k;
    }
    const bench::ServeBenchSummary s = bench::run_serve_bench(o, !a.quiet);
    std::fputs(bench::format_summary(s, o).c_str(), stdout);
    std::fflush(stdout);
    if (!a.json_path.empty()) {
        std::ofstream f(a.json_path);
        if (!f) fail("bench serve: cannot write ", a.json_path);
        f << bench::summary_json(s, o).dump(2) << "\n";
        if (!f) fail("bench serve: cannot write ", a.json_path);
    }
    return s.failed == 0 ? 0 : 1;
}

}  // namespace

std::function<int()> add_bench(CLI::App& app) {
    CLI::App* group = app.add_subcommand("bench", "Benchmarks");
    group->require_subcommand(1);
    auto a = std::make_shared<BenchServeArgs>();
    bench::ServeBenchOptions& o = a->opts;
    CLI::App* cmd = group->add_subcommand(
        "serve",
        "Load-test an OpenAI-compatible server with streamed requests (in the manner of vLLM's benchmark_serving)");
    cmd->add_option("--url,--base-url", o.url, "The server: http://HOST:PORT[/prefix] (default http://127.0.0.1:8000)");
    cmd->add_option("--host", a->host, "Server host (instead of --url)");
    cmd->add_option("--port", a->port, "Server port (instead of --url)")->check(CLI::Range(1, 65535));
    cmd->add_option("--endpoint", o.endpoint, "completions (/v1/completions) or chat (/v1/chat/completions)")
        ->check(CLI::IsMember({"completions", "chat"}));
    cmd->add_option("--model", o.model, "Model name to send (default: the first of GET /v1/models)");
    cmd->add_option("--api-key", o.api_key, "Sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
    cmd->add_option("--num-requests,--num-prompts,-n", o.num_requests,
                    "Requests to send (default 1000); an error with --dataset multi-turn")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--concurrency,--max-concurrency,-c", o.concurrency,
                    "Requests in flight at once, one keep-alive connection each (default 64)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--client-threads", o.client_threads,
                    "Client threads sharing the connections (random dataset); 0: a quarter of the cores, 1 to 8 "
                    "(default 0). One thread parses ~100k events/s")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--request-rate", o.request_rate,
                    "Poisson arrivals at this many requests/s, still capped by --concurrency (default: all at once)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--prompt-len,--input-len", o.prompt_len,
                    "Prompt length in tokens (ids) or words (default 32); random dataset only")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--output-len", o.output_len,
                    "Tokens to generate per request: max_tokens with ignore_eos (default 64)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--prompt-kind", o.prompt_kind,
                    "ids: random token ids (completions only); words: random common words; auto: ids for "
                    "completions, words for chat (default auto); multi-turn always sends words")
        ->check(CLI::IsMember({"auto", "ids", "words"}));
    cmd->add_option("--dataset", o.dataset,
                    "random: independent random prompts (default); multi-turn: --num-users chats sharing one system "
                    "prompt, each turn resending the whole conversation with the server's answers as text "
                    "(implies --prompt-kind words; sends --num-users x --turns requests, so --num-requests, "
                    "--prompt-len and --request-rate are errors)")
        ->check(CLI::IsMember({"random", "multi-turn"}));
    cmd->add_option(
           "--num-users", o.num_users,
           "multi-turn: simulated users, each one conversation; --concurrency requests in flight at once (default 16)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--turns", o.turns, "multi-turn: turns per user, each sent after the previous answer (default 4)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--system-prompt-len", o.system_prompt_len,
                    "multi-turn: words of the system prompt every user shares (default 256)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--turn-len", o.turn_len, "multi-turn: words of each user turn (default 32)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--turn-order", o.turn_order,
                    "multi-turn: interleaved (default): every user is live, each next turn queued behind the other "
                    "users' (the servers must keep every conversation between turns); sequential: one user's turns "
                    "back to back, --concurrency users at a time")
        ->check(CLI::IsMember({"interleaved", "sequential"}));
    cmd->add_option("--metrics-url", o.metrics_urls,
                    "Prometheus endpoint to read the prefix-cache counters from before and after the run, e.g. each "
                    "replica behind a router; repeatable; /metrics is appended unless the path ends in it (default: "
                    "the --url server's /metrics)");
    cmd->add_option("--token-id-range", a->token_id_range,
                    "Random prompt ids are drawn from MIN:MAX (default 100:499)");
    cmd->add_option("--temperature", o.temperature, "Sampling temperature sent with each request (default 0)");
    cmd->add_option("--seed", o.seed, "Seed of the random prompts (default 0)");
    cmd->add_option("--timeout", o.timeout_s, "Per-request timeout in seconds (default 600)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--json", a->json_path, "Also write the results to this JSON file");
    cmd->add_flag("--quiet,-q", a->quiet, "No progress lines on stderr");
    auto offline = add_bench_offline(group);
    return [a, cmd, offline] {
        if (!cmd->parsed()) return offline();
        a->num_requests_given = cmd->count("--num-requests") > 0;
        a->prompt_len_given = cmd->count("--prompt-len") > 0;
        return run_bench_serve(*a);
    };
}

}  // namespace peregrine::cli
