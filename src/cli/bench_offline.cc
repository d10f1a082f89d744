// `peregrine bench throughput` and `peregrine bench latency`: the engine driven directly (no
// server), in the manner of vLLM's benchmark_throughput / benchmark_latency. Prompts are random
// token ids (lengths drawn as vLLM's random dataset does with --range-ratio), EOS ignored unless
// --no-ignore-eos, greedy sampling. The whole workload runs once unmeasured first (CUDA graphs,
// cuBLASLt plans, page faults), then again measured.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_loop.h"
#include "engine/model_tokenizer.h"
#include "engine/structured_output.h"
#include "model/hf_cache.h"
#include "worker/parallel_executor.h"

namespace peregrine::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct OfflineArgs {
    EngineConfig engine;
    int num_prompts = 256;
    int batch_size = 1;
    int input_len = 128;
    int output_len = 128;
    int warmup = 1;
    int iters = 3;
    uint32_t seed = 0;
    double range_ratio = 0;  // lengths uniform in [L(1-R), L(1+R)]
    bool ignore_eos = true;
    std::string batching = "continuous";
    std::string json_path;
    std::string schema_path;  // every request constrained by this JSON schema
};

// One round's requests. Every round draws new token ids (so no round hits the prefix cache of
// the one before) but, for a given seed, the same lengths, so rounds are comparable.
std::vector<Request> make_requests(int n, const OfflineArgs& a, int vocab, int round) {
    std::mt19937 lengths(a.seed * 104729u + 17u);
    std::mt19937 rng(a.seed * 7919u + round);
    std::uniform_int_distribution<int32_t> tok(100, std::max(101, vocab - 1));
    auto draw = [&](int len) {
        const int lo = std::max(1, static_cast<int>(std::floor(len * (1.0 - a.range_ratio))));
        const int hi = std::max(lo, static_cast<int>(std::ceil(len * (1.0 + a.range_ratio))));
        return std::uniform_int_distribution<int>(lo, hi)(lengths);
    };
    std::vector<Request> out(n);
    for (int i = 0; i < n; ++i) {
        Request& r = out[i];
        r.id = "b" + std::to_string(round) + "-" + std::to_string(i);
        const int input_len = draw(a.input_len);
        for (int j = 0; j < input_len; ++j) r.prompt_ids.push_back(tok(rng));
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = draw(a.output_len);
        r.sampling.ignore_eos = a.ignore_eos;
    }
    return out;
}

uint64_t prompt_tokens(const std::vector<Request>& reqs) {
    uint64_t n = 0;
    for (const Request& r : reqs) n += r.prompt_ids.size();
    return n;
}

struct RunResult {
    double seconds = 0;
    double first_token_seconds = 0;  // until every request had its first token
    uint64_t prompt_tokens = 0;
    uint64_t output_tokens = 0;
    EngineStats stats;
};

// The core is stepped on this thread (no engine thread in the measurement), without text.
// With --json-schema every request carries the schema's grammar (compiled once, before the
// clock starts), so the measurement includes each step's masks and grammar advances.
struct Bench {
    std::unique_ptr<ModelExecutor> executor;
    CoreConfig core;
    StructuredOutput structured;
    std::shared_ptr<const grammar::TokenizedGrammar> grammar;  // of `structured`
};

Bench make_bench(const EngineConfig& config, const std::string& schema_path = "") {
    Bench b;
    BuiltExecutor built = create_executor(config);
    b.core = core_config(built.worker->config(), built.worker->model_config().eos_token_ids);
    if (!schema_path.empty()) {
        std::ifstream in(schema_path);
        if (!in) fail("bench: cannot read --json-schema ", schema_path);
        StructuredOutput so;
        so.kind = StructuredOutput::Kind::JsonSchema;
        so.field = "--json-schema";
        so.spec.assign(std::istreambuf_iterator<char>(in), {});
        const std::shared_ptr<const Tokenizer> tokenizer = model_tokenizer(config, built.worker->loaded());
        GrammarCache cache(*tokenizer, b.core.eos_token_ids);
        b.grammar = cache.get(so);  // self-contained: holds its own copy of the vocabulary index
        b.structured = std::move(so);
    }
    b.executor = std::move(built.executor);
    return b;
}

// Continuous batching submits every request at once and the scheduler admits one as soon as a
// slot and KV blocks free up; static batching (the baseline of the continuous-batching papers)
// submits max_num_seqs requests and the next group only when the whole group has ended.
RunResult run_all(Bench& s, const std::vector<Request>& reqs, bool static_batching) {
    EngineCore core(s.core, *s.executor);
    const size_t group = static_batching ? static_cast<size_t>(s.core.scheduler.max_num_seqs) : reqs.size();
    const auto t0 = Clock::now();
    RunResult res;
    res.prompt_tokens = prompt_tokens(reqs);
    size_t next = 0;
    size_t with_first = 0;
    std::vector<char> seen(reqs.size(), 0);
    while (next < reqs.size() || core.has_unfinished()) {
        if (!core.has_unfinished())
            for (const size_t until = std::min(reqs.size(), next + group); next < until;) {
                Request r = reqs[next++];
                if (s.grammar) r.sampling.structured = s.structured;
                core.add_request(std::move(r), s.grammar);
            }
        for (const RequestOutput& o : core.step()) {
            res.output_tokens += o.token_ids.size();
            const size_t idx = std::stoul(o.request_id.substr(o.request_id.find('-') + 1));
            if (!seen[idx] && !o.token_ids.empty()) {
                seen[idx] = 1;
                if (++with_first == reqs.size())
                    res.first_token_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
            }
        }
    }
    res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    res.stats = core.stats();
    return res;
}

void write_json(const std::string& path, const nlohmann::json& j) {
    if (path.empty()) return;
    std::ofstream f(path);
    f << j.dump(2) << "\n";
    if (!f) fail("bench: cannot write ", path);
}

int run_throughput(OfflineArgs& a) {
    Bench s = make_bench(a.engine, a.schema_path);
    const int vocab = s.executor->vocab_size();
    const bool stat = a.batching == "static";
    for (int w = 0; w < a.warmup; ++w) run_all(s, make_requests(a.num_prompts, a, vocab, -1 - w), stat);
    RunResult best;
    nlohmann::json runs = nlohmann::json::array();
    for (int it = 0; it < a.iters; ++it) {
        const RunResult r = run_all(s, make_requests(a.num_prompts, a, vocab, it), stat);
        const double total = static_cast<double>(r.output_tokens + r.prompt_tokens);
        std::printf(
            "run %d: %.3f s, %llu output tokens, %.1f output tok/s, %.1f total tok/s, all first tokens "
            "at %.3f s (%.1f prompt tok/s)\n",
            it, r.seconds, static_cast<unsigned long long>(r.output_tokens), r.output_tokens / r.seconds,
            total / r.seconds, r.first_token_seconds, r.prompt_tokens / r.first_token_seconds);
        runs.push_back({{"elapsed_time", r.seconds},
                        {"output_tokens", r.output_tokens},
                        {"output_tokens_per_second", r.output_tokens / r.seconds}});
        if (it == 0 || r.seconds < best.seconds) best = r;
    }
    const EngineStats& st = best.stats;
    const double total = static_cast<double>(best.output_tokens + best.prompt_tokens);
    std::printf(
        "throughput (best of %d, %s batching): %d prompts x (%d in, %d out%s): %.1f requests/s, %.1f output "
        "tok/s, %.1f total tok/s\n"
        "  tokens: %llu prompt, %llu output\n"
        "  prefill: %.1f prompt tok/s until every first token\n"
        "  steps %llu; schedule %.3f s, execute %.3f s, postprocess %.3f s\n",
        a.iters, a.batching.c_str(), a.num_prompts, a.input_len, a.output_len,
        a.range_ratio > 0 ? str_cat(", lengths x [", 1 - a.range_ratio, ", ", 1 + a.range_ratio, "]").c_str() : "",
        a.num_prompts / best.seconds, best.output_tokens / best.seconds, total / best.seconds,
        static_cast<unsigned long long>(best.prompt_tokens), static_cast<unsigned long long>(best.output_tokens),
        best.prompt_tokens / best.first_token_seconds, static_cast<unsigned long long>(st.steps), st.schedule_seconds,
        st.execute_seconds, st.postprocess_seconds);
    // vLLM's benchmark_throughput --output-json keys, then ours.
    write_json(a.json_path, {{"elapsed_time", best.seconds},
                             {"num_requests", a.num_prompts},
                             {"total_num_tokens", best.output_tokens + best.prompt_tokens},
                             {"requests_per_second", a.num_prompts / best.seconds},
                             {"tokens_per_second", total / best.seconds},
                             {"output_tokens_per_second", best.output_tokens / best.seconds},
                             {"prompt_tokens", best.prompt_tokens},
                             {"output_tokens", best.output_tokens},
                             {"all_first_tokens_seconds", best.first_token_seconds},
                             {"steps", st.steps},
                             {"input_len", a.input_len},
                             {"output_len", a.output_len},
                             {"range_ratio", a.range_ratio},
                             {"seed", a.seed},
                             {"ignore_eos", a.ignore_eos},
                             {"batching", a.batching},
                             {"json_schema", a.schema_path},
                             {"max_num_seqs", s.core.scheduler.max_num_seqs},
                             {"max_num_batched_tokens", s.core.scheduler.max_num_batched_tokens},
                             {"runs", runs}});
    return 0;
}

int run_latency(OfflineArgs& a) {
    Bench s = make_bench(a.engine);
    const int vocab = s.executor->vocab_size();
    for (int w = 0; w < a.warmup; ++w) run_all(s, make_requests(a.batch_size, a, vocab, -1 - w), false);
    double best_decode = 0, best_total = 1e30, best_prefill = 1e30;
    for (int it = 0; it < a.iters; ++it) {
        const RunResult r = run_all(s, make_requests(a.batch_size, a, vocab, it), false);
        const double decode_s = r.seconds - r.first_token_seconds;
        const double decode_tps = a.batch_size * static_cast<double>(a.output_len - 1) / decode_s;
        // Per step: schedule (CPU, before the launch), execute (enqueueing the model), postprocess
        // (sampling, which waits for the GPU, then outputs).
        const double steps = std::max<double>(1, static_cast<double>(r.stats.steps));
        std::printf(
            "run %d: %.4f s total, prefill + first token %.4f s, decode %.1f tok/s (%.3f ms/step; per step "
            "schedule %.3f ms, execute %.3f ms, postprocess %.3f ms)\n",
            it, r.seconds, r.first_token_seconds, decode_tps, 1e3 * decode_s / std::max(1, a.output_len - 1),
            1e3 * r.stats.schedule_seconds / steps, 1e3 * r.stats.execute_seconds / steps,
            1e3 * r.stats.postprocess_seconds / steps);
        best_decode = std::max(best_decode, decode_tps);
        best_total = std::min(best_total, r.seconds);
        best_prefill = std::min(best_prefill, r.first_token_seconds);
    }
    std::printf(
        "latency (best of %d): batch %d, %d in, %d out: %.4f s per batch, time to first token %.4f s, "
        "decode %.1f tok/s (%.1f tok/s per sequence)\n",
        a.iters, a.batch_size, a.input_len, a.output_len, best_total, best_prefill, best_decode,
        best_decode / a.batch_size);
    // vLLM's benchmark_latency --output-json has the per-batch latency; ours adds the rest.
    write_json(a.json_path, {{"avg_latency", best_total},
                             {"batch_size", a.batch_size},
                             {"input_len", a.input_len},
                             {"output_len", a.output_len},
                             {"time_to_first_token", best_prefill},
                             {"decode_tokens_per_second", best_decode}});
    return 0;
}

void add_common(CLI::App* cmd, OfflineArgs& a) {
    add_engine_options(cmd, a.engine);
    cmd->add_option("--input-len", a.input_len, "Prompt tokens per request (default 128)")->check(CLI::PositiveNumber);
    cmd->add_option("--output-len", a.output_len, "Generated tokens per request (default 128)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--range-ratio", a.range_ratio,
                    "Draw each prompt and output length uniformly in [L*(1-R), L*(1+R)], as vLLM's random dataset "
                    "(default 0: every request exactly --input-len / --output-len)")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_flag("--ignore-eos,!--no-ignore-eos", a.ignore_eos,
                  "Generate --output-len tokens even past EOS (default on; --no-ignore-eos stops at EOS)");
    cmd->add_option("--warmup", a.warmup, "Unmeasured runs first (default 1)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--iters", a.iters, "Measured runs; the best is reported (default 3)")->check(CLI::PositiveNumber);
    cmd->add_option("--seed,--prompt-seed", a.seed, "Seed of the random prompts and their lengths (default 0)");
    cmd->add_option("--json", a.json_path, "Also write the results to this JSON file (vLLM's --output-json keys)");
}

}  // namespace

std::function<int()> add_bench_offline(CLI::App* group) {
    auto a = std::make_shared<OfflineArgs>();
    CLI::App* tp = group->add_subcommand(
        "throughput",
        "Offline throughput: every prompt submitted at once to the engine (like vLLM's benchmark_throughput)");
    add_common(tp, *a);
    tp->add_option("--num-prompts,-n", a->num_prompts, "Requests (default 256)")->check(CLI::PositiveNumber);
    tp->add_option("--batching", a->batching,
                   "continuous (every request submitted at once, admitted as slots free) | static (max-num-seqs "
                   "requests at a time, the next group when the whole group has ended) (default continuous)")
        ->check(CLI::IsMember({"continuous", "static"}));
    tp->add_option("--json-schema", a->schema_path,
                   "Constrain every request's output by this JSON schema file (structured output; needs the "
                   "model's tokenizer). A request whose grammar completes ends there, before --output-len");
    auto b = std::make_shared<OfflineArgs>();
    CLI::App* lat = group->add_subcommand(
        "latency", "One batch of requests start to end: time to first token and decode speed (like benchmark_latency)");
    add_common(lat, *b);
    lat->add_option("--batch-size", b->batch_size, "Requests in the batch (default 1)")->check(CLI::PositiveNumber);
    // The engine options these runs cannot honour: random token ids, greedy, no text.
    auto refuse_unused = [](const OfflineArgs& x) {
        if (!x.engine.tokenizer.empty() && x.schema_path.empty())
            fail(
                "--tokenizer: bench throughput and latency send random token ids and read no tokenizer (but "
                "for --json-schema)");
        if (x.engine.generation_config != "auto")
            fail("--generation-config: bench throughput and latency sample greedily and read no sampling defaults");
    };
    return [a, b, tp, lat, refuse_unused]() -> int {
        OfflineArgs* x = tp->parsed() ? a.get() : lat->parsed() ? b.get() : nullptr;
        if (!x) return -1;
        refuse_unused(*x);
        x->engine.model = resolve_model_path(x->engine.model);
        return x == a.get() ? run_throughput(*x) : run_latency(*x);
    };
}

}  // namespace peregrine::cli
