// What a caller chooses when it builds an engine (Engine::create), and the counters it reads
// back. Every field has the default `peregrine serve` uses; the CLI only maps flags onto it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace peregrine {

struct EngineConfig {
    // --- the model
    std::string model;                 // a folder (config.json + safetensors) or a .gguf; empty: the embedded model
    std::string load_format = "auto";  // auto (read the weights) | dummy (random weights of the model's shape)
    uint64_t dummy_seed = 0;           // seed of dummy weights
    // Called with (bytes done, bytes total) while weights are paged in; may be empty.
    std::function<void(size_t, size_t)> load_progress;

    // --- the device
    std::string device = "auto";          // auto (cuda when a GPU is present) | cuda | cpu
    int threads = 0;                      // CPU threads; 0 = one per core
    std::string dtype = "auto";           // CPU activation precision: auto | float32 | bfloat16
    double gpu_memory_utilization = 0.9;  // CUDA: share of GPU memory for weights, activations and KV cache
    bool enforce_eager = false;           // CUDA: no graph recording
    bool batch_invariant = false;         // CUDA: a request's tokens do not depend on the rest of the batch

    // --- the KV cache
    int block_size = 16;              // tokens per block
    int64_t kv_cache_memory = 0;      // bytes; 0 = CUDA: what the utilisation target leaves, CPU: room for
                                      // max_num_seqs full contexts, at most 4 GiB
    std::string kv_eviction = "lru";  // prefix-cache eviction: lru | lfu | fifo
    bool prefix_caching = true;

    // --- the scheduler
    int max_num_seqs = 256;             // sequences in one step at most
    int max_num_batched_tokens = 2048;  // tokens in one step at most
    // With device sampling, queue step N+1 before step N's tokens come back.
    bool async_scheduling = true;

    // Throws Error naming the field when a value is out of range or unknown.
    void validate() const;
};

struct EngineStats {
    int num_running = 0;
    int num_waiting = 0;  // sequences, an n > 1 request not started yet counted as n
    int num_kv_blocks = 0;
    int num_kv_blocks_used = 0;
    uint64_t prefix_queries = 0;  // tokens
    uint64_t prefix_hits = 0;     // tokens
    uint64_t evictions = 0;
    uint64_t preemptions = 0;
    uint64_t prompt_tokens = 0;  // of finished and running requests, counted at submit
    uint64_t generation_tokens = 0;
    uint64_t steps = 0;
    // Cumulative wall time of the step's phases, seconds.
    double schedule_seconds = 0;     // scheduler + block manager + batch building
    double execute_seconds = 0;      // the model
    double postprocess_seconds = 0;  // sampling and outputs
};

}  // namespace peregrine
