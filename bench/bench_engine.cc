// Engine benchmarks (not part of the test suite):
//   overhead  — schedule + block manager + sampling time per step with a model that costs
//               nothing, at 256 running sequences;
//   batching  — continuous vs static batching of a mixed-length workload on the embedded
//               model (CPU backend, f32).
//   overhead-text — the same with detokenization and a stop string (a real tokenizer).
// Usage: peregrine_bench_engine overhead
//        peregrine_bench_engine batching [MODEL|default] [threads] [batch] [requests]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_core.h"
#include "engine/output_processor.h"
#include "engine/tokenizer_text.h"
#include "model/llama.h"
#include "model/loader.h"
#include "worker/local_executor.h"

using namespace peregrine;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// Logits that cost only the memory they occupy, shaped like a language model's: a Zipf-like
// fall-off over a fixed random order of the vocabulary.
class NullExecutor final : public ModelExecutor {
  public:
    NullExecutor(int vocab, int blocks) : vocab_(vocab), blocks_(blocks) {}
    int vocab_size() const override { return vocab_; }
    int max_model_len() const override { return 1 << 20; }
    int num_kv_blocks() const override { return blocks_; }
    int block_size() const override { return 16; }
    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>&) override {}
    void execute(const BatchInput& b, std::vector<float>& logits) override {
        const size_t n = b.logits_indices.size() * vocab_;
        if (logits.size() != n) {
            logits.resize(n);
            std::vector<int> order(vocab_);
            for (int i = 0; i < vocab_; ++i) order[i] = i;
            std::shuffle(order.begin(), order.end(), std::mt19937(5));
            for (size_t i = 0; i < n; ++i) logits[i] = -1.2f * std::log(1.0f + order[i % vocab_]);
        }
    }

  private:
    int vocab_, blocks_;
};

// Draws that cost nothing, as if sampled on a device: varied real token ids, so that the
// text side has work. The step time is then the engine's own (schedule, outputs, text).
class DrawingExecutor final : public ModelExecutor {
  public:
    DrawingExecutor(int vocab, int blocks) : vocab_(vocab), blocks_(blocks) {}
    int vocab_size() const override { return vocab_; }
    int max_model_len() const override { return 1 << 20; }
    int num_kv_blocks() const override { return blocks_; }
    int block_size() const override { return 16; }
    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>&) override {}
    void execute(const BatchInput&, std::vector<float>&) override {}
    bool samples_on_device() const override { return true; }
    void execute_on_device(const BatchInput&) override {}
    void launch_sampling(const std::vector<SampleRow>& rows) override { n_ = rows.size(); }
    void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& lps) override {
        tokens.resize(n_);
        lps.resize(n_);
        for (size_t i = 0; i < n_; ++i) tokens[i] = 1000 + static_cast<int32_t>((i * 7919 + ++draws_ * 31) % 20000);
    }

  private:
    int vocab_, blocks_;
    size_t n_ = 0;
    uint64_t draws_ = 0;
};

void overhead(int vocab, float temperature) {
    const int num_seqs = 256;
    NullExecutor ex(vocab, num_seqs * 80);
    CoreConfig cfg;
    cfg.scheduler.max_num_seqs = num_seqs;
    cfg.scheduler.max_num_batched_tokens = 8192;
    EngineCore core(cfg, ex);
    std::mt19937 rng(1);
    for (int i = 0; i < num_seqs; ++i) {
        Request r;
        r.id = std::to_string(i);
        for (int j = 0; j < 200; ++j) r.prompt_ids.push_back(rng() % vocab);
        r.sampling.max_tokens = 1000;
        r.sampling.ignore_eos = true;
        r.sampling.temperature = temperature;
        r.sampling.top_p = temperature > 0 ? 0.9f : 1.0f;
        core.add_request(std::move(r));
    }
    core.step();  // prefill of all 256
    const EngineStats before = core.stats();
    const int steps = 200;
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) core.step();
    const double per_step = seconds_since(t0) / steps;
    const EngineStats after = core.stats();
    std::printf(
        "overhead: %d sequences, vocab %6d, %-23s: %.3f ms per decode step; scheduler + blocks + batch %.3f ms, "
        "sampling + outputs %.3f ms\n",
        core.stats().num_running, vocab, temperature > 0 ? "temperature 1, top-p 0.9" : "greedy", per_step * 1e3,
        (after.schedule_seconds - before.schedule_seconds) / steps * 1e3,
        (after.postprocess_seconds - before.postprocess_seconds) / steps * 1e3);
}

// As `overhead`, with text: the tokenizer in `tokenizer_dir` detokenizes every sequence and
// watches for a stop string that never comes. The engine step no longer does this (the
// front end does, on the consumer's thread: output_processor.h); both times are reported.
void overhead_text(const std::string& tokenizer_dir) {
    const int num_seqs = 256;
    auto tok = std::make_shared<const Tokenizer>(Tokenizer::load(tokenizer_dir));
    const int vocab = tok->size();
    DrawingExecutor ex(vocab, num_seqs * 80);
    CoreConfig cfg;
    cfg.scheduler.max_num_seqs = num_seqs;
    cfg.scheduler.max_num_batched_tokens = 8192;
    EngineCore core(cfg, ex);
    TokenizerText text(tok);
    std::unordered_map<std::string, std::unique_ptr<RequestText>> texts;
    std::mt19937 rng(1);
    for (int i = 0; i < num_seqs; ++i) {
        Request r;
        r.id = std::to_string(i);
        for (int j = 0; j < 200; ++j) r.prompt_ids.push_back(1000 + rng() % 20000);
        r.sampling.max_tokens = 1000;
        r.sampling.ignore_eos = true;
        r.sampling.temperature = 0.0f;
        r.sampling.stop = {"xyzzy never"};
        texts[r.id] = std::make_unique<RequestText>(text, r);
        core.add_request(std::move(r));
    }
    core.step();  // prefill of all 256
    const int steps = 200;
    double step_s = 0, text_s = 0;
    size_t chars = 0;
    for (int i = 0; i < steps; ++i) {
        const auto t0 = Clock::now();
        std::vector<RequestOutput> outs = core.step();
        const auto t1 = Clock::now();
        for (RequestOutput& o : outs) {
            int stopped = -1;
            texts.at(o.request_id)->process(o, &stopped);
            chars += o.text.size();
        }
        step_s += std::chrono::duration<double>(t1 - t0).count();
        text_s += seconds_since(t1);
    }
    std::printf(
        "overhead-text: %d sequences, vocab %d (%s): engine step %.3f ms; text on the consumer side %.3f ms "
        "per step (%zu chars)\n",
        num_seqs, vocab, tokenizer_dir.c_str(), step_s / steps * 1e3, text_s / steps * 1e3, chars);
}

void batching(const std::string& model_path, int threads, int batch, int count) {
    CpuBackend backend(threads);
    LoadOptions opt;
    opt.matmul_dtype_ok = [&](DType t) { return backend.supports_weight_dtype(t); };
    auto m = load_model(model_path.empty() ? default_model_path() : model_path, opt);
    LlamaModel model(*m, backend);
    const int vocab = m->config.vocab_size;
    // Prompts of 16-64 tokens; outputs of 8-64 tokens, a quarter of them 128-256 (long tail).
    std::mt19937 rng(42);
    std::vector<Request> reqs;
    for (int i = 0; i < count; ++i) {
        Request r;
        r.id = std::to_string(i);
        r.prompt_ids.push_back(1);
        const int len = 16 + rng() % 49;
        for (int j = 1; j < len; ++j) r.prompt_ids.push_back(3 + rng() % std::min(vocab - 3, 30000));
        r.sampling.temperature = 0;
        r.sampling.ignore_eos = true;
        r.sampling.max_tokens = (rng() % 4 == 0) ? 128 + rng() % 129 : 8 + rng() % 57;
        reqs.push_back(r);
    }
    auto run = [&](bool continuous) {
        auto ex_exec = LocalExecutor::over(backend, model, 1024, 16);
        LocalExecutor& ex = *ex_exec;
        CoreConfig cfg;
        cfg.scheduler.max_num_seqs = batch;
        EngineCore core(cfg, ex);
        size_t next = 0;
        uint64_t tokens = 0;
        const auto t0 = Clock::now();
        while (next < reqs.size() || core.has_unfinished()) {
            // Static batching admits a new batch only when the previous one has fully ended.
            if (continuous ? next < reqs.size() : !core.has_unfinished()) {
                const size_t until = continuous ? reqs.size() : std::min(reqs.size(), next + batch);
                while (next < until) core.add_request(reqs[next++]);
            }
            for (const RequestOutput& o : core.step()) tokens += o.token_ids.size();
        }
        const double s = seconds_since(t0);
        std::printf("batching: %-10s %3zu requests, batch %d: %.2f s, %llu output tokens, %.1f tokens/s, %llu steps\n",
                    continuous ? "continuous" : "static", reqs.size(), batch, s,
                    static_cast<unsigned long long>(tokens), tokens / s,
                    static_cast<unsigned long long>(core.stats().steps));
        return tokens / s;
    };
    const double st = run(false), ct = run(true);
    std::printf("batching: continuous / static throughput = %.2fx (%s)\n", ct / st, backend.name().c_str());
}

}  // namespace

int main(int argc, char** argv) {
    const std::string what = argc > 1 ? argv[1] : "all";
    if (what == "overhead-text") {
        if (argc < 3) {
            std::fprintf(stderr, "usage: peregrine_bench_engine overhead-text TOKENIZER_DIR\n");
            return 2;
        }
        overhead_text(argv[2]);
        return 0;
    }
    if (what == "overhead" || what == "all") {
        overhead(512, 0.0f);
        overhead(32000, 0.0f);
        overhead(32000, 1.0f);
        overhead(151936, 0.0f);
    }
    if (what == "batching" || what == "all") {
        const std::string model = argc > 2 ? argv[2] : "";
        batching(model == "default" ? "" : model, argc > 3 ? std::atoi(argv[3]) : 0, argc > 4 ? std::atoi(argv[4]) : 16,
                 argc > 5 ? std::atoi(argv[5]) : 96);
    }
    return 0;
}
