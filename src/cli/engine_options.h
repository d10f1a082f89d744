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
};

void add_engine_options(CLI::App* cmd, EngineOptions& opts);

// Everything a running engine needs, in construction order.
struct EngineStack {
    std::unique_ptr<CpuBackend> backend;
    std::unique_ptr<LoadedModel> loaded;
    std::unique_ptr<LlamaModel> model;
    EngineConfig config;
    int num_kv_blocks = 0;
    std::unique_ptr<ModelExecutor> executor;
};

// Loads the model and sizes the KV cache, logging what it chose to stderr.
EngineStack build_engine_stack(const EngineOptions& opts);

}  // namespace peregrine::cli
