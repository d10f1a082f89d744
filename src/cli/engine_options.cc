#include "cli/engine_options.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/model_runner.h"
#include "model/batch.h"
#include "model/kv_cache.h"
#ifdef PG_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sampler.h"
#endif

namespace peregrine::cli {

namespace {

// A progress line on stderr for big models on a terminal.
std::function<void(size_t, size_t)> progress_printer() {
    if (!::isatty(STDERR_FILENO)) return {};
    return [last = -1](size_t done, size_t total) mutable {
        if (total < (size_t{1} << 30)) return;
        const int pct = static_cast<int>(100.0 * done / total);
        if (pct == last) return;
        last = pct;
        std::fprintf(stderr, "\rloading weights: %3d%% (%.1f / %.1f GB)%s", pct, done / 1e9, total / 1e9,
                     done >= total ? "\n" : "");
    };
}

}  // namespace

void add_engine_options(CLI::App* cmd, EngineOptions& o) {
    cmd->add_option("--model", o.model,
                    "Model folder (config.json + safetensors) or GGUF file; default: the embedded stories260K");
    cmd->add_option("--threads", o.threads, "CPU threads (default: one per core)");
    cmd->add_option("--dtype", o.dtype,
                    "Activation precision: float32 (reference), bfloat16 (bf16 matmul inputs for bf16 weights), "
                    "auto (float32 for now)")
        ->check(CLI::IsMember({"auto", "float32", "bfloat16"}));
    cmd->add_option("--block-size", o.block_size, "Tokens per KV-cache block (default 16)")->check(CLI::Range(1, 1024));
    cmd->add_option("--kv-cache-memory", o.kv_cache_memory,
                    "KV-cache bytes (default: room for max-num-seqs full contexts, at most 4 GiB)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--kv-eviction", o.kv_eviction, "Prefix-cache eviction: lru | lfu | fifo (default lru)")
        ->check(CLI::IsMember({"lru", "lfu", "fifo"}));
    cmd->add_flag("--no-prefix-caching", o.no_prefix_caching, "Do not reuse KV blocks across requests");
    cmd->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "Token budget of one step (default 2048)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--max-num-seqs", o.max_num_seqs, "Sequences in one step at most (default 256)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--device", o.device, "cuda | cpu | auto (default: cuda when a GPU is present)")
        ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
    cmd->add_option("--load-format", o.load_format,
                    "auto (read the weights) | dummy (random weights of the model's shape, for benchmarks)")
        ->check(CLI::IsMember({"auto", "dummy"}));
    cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                    "Share of GPU memory for weights, activations and the KV cache (default 0.9)")
        ->check(CLI::Range(0.05, 1.0));
    cmd->add_flag("--enforce-eager", o.enforce_eager, "CUDA: run every step eagerly (no CUDA graphs)");
    cmd->add_flag("--no-async-scheduling", o.no_async_scheduling,
                  "CUDA: wait for each step's tokens before queueing the next (default: the next step is "
                  "queued first, taking the tokens on the device)");
    cmd->add_flag("--batch-invariant", o.batch_invariant,
                  "CUDA: batch-invariant kernels: a request's tokens do not depend on what else is in the batch "
                  "or on how its prompt was chunked (greedy output as when run alone; slower)");
    cmd->add_option("--dummy-seed", o.dummy_seed, "Seed of --load-format dummy weights (default 0)");
}

namespace {

// The device `--device auto` means: cuda when built with CUDA and a GPU is present.
std::string resolve_device(const std::string& d) {
#ifdef PG_WITH_CUDA
    if (d == "auto") return cuda_device_available() ? "cuda" : "cpu";
    return d;
#else
    if (d == "cuda") fail("--device cuda: this build has no CUDA backend (nvcc was not found at build time)");
    return "cpu";
#endif
}

// A prefill of `tokens` tokens over `seqs` sequences, each sampling its last token: the
// largest step the scheduler can send, run once to size activations and scratch.
void profile_step(LlamaModel& model, Backend& backend, int tokens, int seqs, int block_size) {
    seqs = std::max(1, std::min(seqs, tokens));
    const int per = tokens / seqs;
    BatchInput b;
    b.query_start.push_back(0);
    const int blocks_per_seq = (per + tokens % seqs + block_size - 1) / block_size;
    b.max_blocks_per_seq = blocks_per_seq;
    int next_block = 0;
    for (int s = 0; s < seqs; ++s) {
        const int len = per + (s == seqs - 1 ? tokens % seqs : 0);
        for (int p = 0; p < len; ++p) {
            b.token_ids.push_back(p % 2);
            b.positions.push_back(p);
            b.slot_mapping.push_back((next_block + p / block_size) * block_size + p % block_size);
        }
        for (int i = 0; i < blocks_per_seq; ++i) b.block_tables.push_back(next_block + i);
        next_block += blocks_per_seq;
        b.context_lens.push_back(len);
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
    }
    KvCache cache(backend, model.kv_cache_shape(next_block, block_size));
    std::vector<float> logits;
    model.forward(b, cache, logits);
}

// Runs one decode step of every batch bucket the backend records (CUDA graphs), so the
// recordings, the first launch of each kernel and the decode products' algorithm timing happen
// before the first request instead of inside its time to first token. A recording may also
// depend on the context length (CUDA: the decode attention's shape at <= 4 sequences), so
// each bucket runs at 1 and at 512 tokens of context. The steps write one cache slot per
// sequence in blocks [0, bucket * blocks per sequence): free blocks, written again before any read.
void record_decode_steps(ModelExecutor& executor, const Backend& backend, int max_seqs, int block_size) {
    const auto t0 = std::chrono::steady_clock::now();
    int steps = 0, last = 0;
    for (int n = 1; n <= max_seqs; ++n) {
        const int bucket = backend.step_bucket(n);
        if (bucket <= 0 || bucket == last) continue;
        last = bucket;
        for (const int context : {1, 512}) {
            const int blocks = (context + block_size - 1) / block_size, pos = context - 1;
            if (static_cast<int64_t>(bucket) * blocks > executor.num_kv_blocks()) continue;
            BatchInput b;
            b.max_blocks_per_seq = blocks;
            b.query_start.push_back(0);
            for (int s = 0; s < bucket; ++s) {
                b.token_ids.push_back(0);
                b.positions.push_back(pos);
                b.slot_mapping.push_back((s * blocks + pos / block_size) * block_size + pos % block_size);
                for (int i = 0; i < blocks; ++i) b.block_tables.push_back(s * blocks + i);
                b.context_lens.push_back(context);
                b.query_start.push_back(s + 1);
                b.logits_indices.push_back(s);
            }
            executor.execute_on_device(b);
            ++steps;
        }
    }
    if (steps > 0)
        std::fprintf(stderr, "  ran %d decode steps to record their graphs (%.2fs)\n", steps,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

EngineStack build_engine_stack(const EngineOptions& o) {
    EngineStack s;
    const std::string device = resolve_device(o.device);
#ifdef PG_WITH_CUDA
    CudaBackend* cuda = nullptr;
    if (device == "cuda") {
        CudaOptions co;
        co.graphs = !o.enforce_eager;
        co.batch_invariant = o.batch_invariant;
        co.max_graph_batch = std::min(o.max_num_seqs, 256);
        auto b = std::make_unique<CudaBackend>(co);
        cuda = b.get();
        s.backend = std::move(b);
    }
#endif
    if (!s.backend) s.backend = std::make_unique<CpuBackend>(o.threads, cpu_precision_from_name(o.dtype));
    LoadOptions opt;
    Backend* backend = s.backend.get();
    opt.matmul_dtype_ok = [backend](DType t) { return backend->supports_weight_dtype(t); };
    opt.progress = progress_printer();
    const std::string path = o.model.empty() ? default_model_path() : o.model;
    const auto t0 = std::chrono::steady_clock::now();
    s.loaded = o.load_format == "dummy" ? load_dummy_model(path, *backend, o.dummy_seed) : load_model(path, opt);
    const ModelConfig& c = s.loaded->config;
    s.model = std::make_unique<LlamaModel>(*s.loaded, *s.backend);  // places the weights
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "model: %s (%s, %.2fs)\n  %s\n  weights: %s\n  backend: %s\n", path.c_str(),
                 s.loaded->format.c_str(), load_s, c.summary().c_str(), s.loaded->weight_dtypes.c_str(),
                 s.backend->name().c_str());
#ifdef PG_WITH_CUDA
    if (cuda != nullptr && o.batch_invariant) std::fprintf(stderr, "  batch-invariant kernels (--batch-invariant)\n");
#endif

    const KvCacheShape one = s.model->kv_cache_shape(1, o.block_size);
    const int64_t per_block = static_cast<int64_t>(one.bytes_per_block());
    int64_t bytes = o.kv_cache_memory;
#ifdef PG_WITH_CUDA
    if (cuda) {
        // Weights are in place; one step of the largest size sizes activations and scratch;
        // the KV cache takes what is left of the utilisation target.
        profile_step(*s.model, *backend, o.max_num_batched_tokens, o.max_num_seqs, o.block_size);
        cuda->synchronize();
        size_t free_b = 0, total_b = 0;
        cuda->memory_info(free_b, total_b);
        const int64_t used = static_cast<int64_t>(total_b - free_b);
        const int64_t budget = static_cast<int64_t>(o.gpu_memory_utilization * static_cast<double>(total_b)) - used;
        std::fprintf(stderr, "  GPU memory: %.2f GiB total, weights %.2f GiB, in use after profiling %.2f GiB\n",
                     total_b / 1073741824.0, cuda->weight_bytes() / 1073741824.0, used / 1073741824.0);
        if (bytes == 0) {
            if (budget < per_block)
                fail("--gpu-memory-utilization ", o.gpu_memory_utilization, " leaves no room for the KV cache (",
                     used >> 20, " MiB in use of ", total_b >> 20, " MiB)");
            bytes = budget;
        }
    }
#endif
    if (bytes == 0) {
        const int64_t want =
            static_cast<int64_t>(o.max_num_seqs) * c.max_position_embeddings / o.block_size * per_block;
        bytes = std::min<int64_t>(want, int64_t{4} << 30);
    }
    s.num_kv_blocks = static_cast<int>(std::min<int64_t>(bytes / per_block, 1 << 30));
    if (s.num_kv_blocks < 1) fail("--kv-cache-memory ", bytes, " is less than one KV block (", per_block, " bytes)");
    std::fprintf(stderr, "  KV cache: %d blocks of %d tokens (%.1f MiB, %s), holds %lld tokens\n", s.num_kv_blocks,
                 o.block_size, s.num_kv_blocks * static_cast<double>(per_block) / (1 << 20),
                 std::string(dtype_name(one.dtype)).c_str(), static_cast<long long>(s.num_kv_blocks) * o.block_size);

    s.config.scheduler.max_num_seqs = o.max_num_seqs;
    s.config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
    s.config.eviction = eviction_policy_from_name(o.kv_eviction);
    s.config.prefix_caching = !o.no_prefix_caching;
    s.config.async_scheduling = !o.no_async_scheduling;
    s.config.eos_token_ids = c.eos_token_ids;
#ifdef PG_WITH_CUDA
    if (cuda) s.sampler = std::make_unique<CudaSampler>(*cuda, o.max_num_seqs, c.vocab_size);
#endif
    s.executor = std::make_unique<LlamaExecutor>(*s.model, *s.backend, s.num_kv_blocks, o.block_size, s.sampler.get());
#ifdef PG_WITH_CUDA
    if (cuda) {
        record_decode_steps(*s.executor, *backend, o.max_num_seqs, o.block_size);
        cuda->synchronize();
    }
#endif
    return s;
}

}  // namespace peregrine::cli
