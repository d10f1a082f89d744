#include "cli/engine_options.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "engine/model_runner.h"

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
}

EngineStack build_engine_stack(const EngineOptions& o) {
    EngineStack s;
    s.backend = std::make_unique<CpuBackend>(o.threads, cpu_precision_from_name(o.dtype));
    LoadOptions opt;
    CpuBackend* backend = s.backend.get();
    opt.matmul_dtype_ok = [backend](DType t) { return backend->supports_weight_dtype(t); };
    opt.progress = progress_printer();
    const std::string path = o.model.empty() ? default_model_path() : o.model;
    const auto t0 = std::chrono::steady_clock::now();
    s.loaded = load_model(path, opt);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const ModelConfig& c = s.loaded->config;
    std::fprintf(stderr, "model: %s (%s, %.2fs)\n  %s\n  weights: %s\n  backend: %s\n", path.c_str(),
                 s.loaded->format.c_str(), load_s, c.summary().c_str(), s.loaded->weight_dtypes.c_str(),
                 s.backend->name().c_str());
    s.model = std::make_unique<LlamaModel>(*s.loaded, *s.backend);

    const KvCacheShape one = s.model->kv_cache_shape(1, o.block_size);
    const int64_t per_block = static_cast<int64_t>(one.bytes_per_block());
    int64_t bytes = o.kv_cache_memory;
    if (bytes == 0) {
        const int64_t want =
            static_cast<int64_t>(o.max_num_seqs) * c.max_position_embeddings / o.block_size * per_block;
        bytes = std::min<int64_t>(want, int64_t{4} << 30);
    }
    s.num_kv_blocks = static_cast<int>(bytes / per_block);
    if (s.num_kv_blocks < 1) fail("--kv-cache-memory ", bytes, " is less than one KV block (", per_block, " bytes)");
    std::fprintf(stderr, "  KV cache: %d blocks of %d tokens (%.1f MiB, f32), holds %lld tokens\n", s.num_kv_blocks,
                 o.block_size, s.num_kv_blocks * static_cast<double>(per_block) / (1 << 20),
                 static_cast<long long>(s.num_kv_blocks) * o.block_size);

    s.config.scheduler.max_num_seqs = o.max_num_seqs;
    s.config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
    s.config.eviction = eviction_policy_from_name(o.kv_eviction);
    s.config.prefix_caching = !o.no_prefix_caching;
    s.config.eos_token_ids = c.eos_token_ids;
    s.executor = std::make_unique<LlamaExecutor>(*s.model, *s.backend, s.num_kv_blocks, o.block_size);
    return s;
}

}  // namespace peregrine::cli
