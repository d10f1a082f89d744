// Options shared by the commands that run the engine (generate, serve, bench), and the
// code that turns them into a loaded model, a backend and an engine.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_core.h"
#include "model/llama.h"
#include "model/loader.h"

namespace peregrine::cli {

struct EngineOptions {
    std::string model;  // empty: the embedded model
    int threads = 0;
    std::string dtype = "auto";
    int block_size = 16;
    int64_t kv_cache_memory = 0;  // bytes; 0 = enough for max_num_seqs full contexts, at most 4 GiB
    std::string kv_eviction = "lru";
    bool no_prefix_caching = false;
    int max_num_batched_tokens = 2048;
    int max_num_seqs = 256;
    std::string device = "auto";       // auto | cuda | cpu
    std::string load_format = "auto";  // auto | dummy
    double gpu_memory_utilization = 0.9;
    bool enforce_eager = false;    // no CUDA graphs
    bool no_async_scheduling = false;
    bool batch_invariant = false;  // CUDA: results independent of the batch (slower)
    uint64_t dummy_seed = 0;
};

void add_engine_options(CLI::App* cmd, EngineOptions& opts);

// Everything a running engine needs, in construction order.
struct EngineStack {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<LoadedModel> loaded;
    std::unique_ptr<LlamaModel> model;
    EngineConfig config;
    int num_kv_blocks = 0;
    std::unique_ptr<DeviceSampler> sampler;  // GPU sampling (CUDA), else null
    std::unique_ptr<ModelExecutor> executor;
};

// Loads the model and sizes the KV cache, logging what it chose to stderr.
EngineStack build_engine_stack(const EngineOptions& opts);

}  // namespace peregrine::cli
