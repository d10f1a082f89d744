// `peregrine bench throughput` and `peregrine bench latency`: the engine driven directly (no
// server), in the manner of vLLM's benchmark_throughput / benchmark_latency. Prompts are random
// token ids, EOS is ignored, greedy sampling. The whole workload runs once unmeasured first
// (CUDA graphs, cuBLASLt plans, page faults), then again measured.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_loop.h"
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
};

std::vector<Request> make_requests(int n, int input_len, int output_len, int vocab, uint32_t seed, int round) {
    std::mt19937 rng(seed * 7919u + round);
    std::uniform_int_distribution<int32_t> tok(100, std::max(101, vocab - 1));
    std::vector<Request> out(n);
    for (int i = 0; i < n; ++i) {
        Request& r = out[i];
        r.id = "b" + std::to_string(round) + "-" + std::to_string(i);
        for (int j = 0; j < input_len; ++j) r.prompt_ids.push_back(tok(rng));
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = output_len;
        r.sampling.ignore_eos = true;
    }
    return out;
}

struct RunResult {
    double seconds = 0;
    double first_token_seconds = 0;  // until every request had its first token
    uint64_t output_tokens = 0;
    EngineStats stats;
};

// The core is stepped on this thread (no engine thread in the measurement), without text.
struct Bench {
    std::unique_ptr<ModelExecutor> executor;
    CoreConfig core;
};

Bench make_bench(const EngineConfig& config) {
    Bench b;
    BuiltExecutor built = create_executor(config);
    b.core = core_config(config, built.worker->model_config().eos_token_ids);
    b.executor = std::move(built.executor);
    return b;
}

RunResult run_all(Bench& s, const std::vector<Request>& reqs) {
    EngineCore core(s.core, *s.executor);
    const auto t0 = Clock::now();
    for (const Request& r : reqs) core.add_request(r);
    RunResult res;
    size_t with_first = 0;
    std::vector<char> seen(reqs.size(), 0);
    while (core.has_unfinished()) {
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

int run_throughput(OfflineArgs& a) {
    Bench s = make_bench(a.engine);
    const int vocab = s.executor->vocab_size();
    for (int w = 0; w < a.warmup; ++w)
        run_all(s, make_requests(a.num_prompts, a.input_len, a.output_len, vocab, a.seed, -1 - w));
    RunResult best;
    for (int it = 0; it < a.iters; ++it) {
        const RunResult r = run_all(s, make_requests(a.num_prompts, a.input_len, a.output_len, vocab, a.seed, it));
        std::printf(
            "run %d: %.3f s, %llu output tokens, %.1f output tok/s, %.1f total tok/s, all first tokens "
            "at %.3f s (%.1f prompt tok/s)\n",
            it, r.seconds, static_cast<unsigned long long>(r.output_tokens), r.output_tokens / r.seconds,
            (r.output_tokens + static_cast<double>(a.num_prompts) * a.input_len) / r.seconds, r.first_token_seconds,
            static_cast<double>(a.num_prompts) * a.input_len / r.first_token_seconds);
        if (it == 0 || r.seconds < best.seconds) best = r;
    }
    const EngineStats& st = best.stats;
    std::printf(
        "throughput (best of %d): %d prompts x (%d in, %d out): %.1f requests/s, %.1f output tok/s, %.1f total tok/s\n"
        "  prefill: %.1f prompt tok/s until every first token\n"
        "  steps %llu; schedule %.3f s, execute %.3f s, postprocess %.3f s\n",
        a.iters, a.num_prompts, a.input_len, a.output_len, a.num_prompts / best.seconds,
        best.output_tokens / best.seconds,
        (best.output_tokens + static_cast<double>(a.num_prompts) * a.input_len) / best.seconds,
        static_cast<double>(a.num_prompts) * a.input_len / best.first_token_seconds,
        static_cast<unsigned long long>(st.steps), st.schedule_seconds, st.execute_seconds, st.postprocess_seconds);
    return 0;
}

int run_latency(OfflineArgs& a) {
    Bench s = make_bench(a.engine);
    const int vocab = s.executor->vocab_size();
    for (int w = 0; w < a.warmup; ++w)
        run_all(s, make_requests(a.batch_size, a.input_len, a.output_len, vocab, a.seed, -1 - w));
    double best_decode = 0, best_total = 1e30, best_prefill = 1e30;
    for (int it = 0; it < a.iters; ++it) {
        const RunResult r = run_all(s, make_requests(a.batch_size, a.input_len, a.output_len, vocab, a.seed, it));
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
    return 0;
}

void add_common(CLI::App* cmd, OfflineArgs& a) {
    add_engine_options(cmd, a.engine);
    cmd->add_option("--input-len", a.input_len, "Prompt tokens per request (default 128)")->check(CLI::PositiveNumber);
    cmd->add_option("--output-len", a.output_len, "Generated tokens per request, EOS ignored (default 128)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--warmup", a.warmup, "Unmeasured runs first (default 1)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--iters", a.iters, "Measured runs; the best is reported (default 3)")->check(CLI::PositiveNumber);
    cmd->add_option("--prompt-seed", a.seed, "Seed of the random prompts (default 0)");
}

}  // namespace

std::function<int()> add_bench_offline(CLI::App* group) {
    auto a = std::make_shared<OfflineArgs>();
    CLI::App* tp = group->add_subcommand(
        "throughput",
        "Offline throughput: every prompt submitted at once to the engine (like vLLM's benchmark_throughput)");
    add_common(tp, *a);
    tp->add_option("--num-prompts,-n", a->num_prompts, "Requests (default 256)")->check(CLI::PositiveNumber);
    auto b = std::make_shared<OfflineArgs>();
    CLI::App* lat = group->add_subcommand(
        "latency", "One batch of requests start to end: time to first token and decode speed (like benchmark_latency)");
    add_common(lat, *b);
    lat->add_option("--batch-size", b->batch_size, "Requests in the batch (default 1)")->check(CLI::PositiveNumber);
    return [a, b, tp, lat]() -> int {
        if (tp->parsed()) return run_throughput(*a);
        if (lat->parsed()) return run_latency(*b);
        return -1;
    };
}

}  // namespace peregrine::cli
