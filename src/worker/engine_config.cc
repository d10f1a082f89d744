// EngineConfig::validate (include/peregrine/engine_config.h): here, beside the workers that
// LocalExecutor::create builds from it, since every engine is built through them.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "peregrine/engine_config.h"

namespace peregrine {

int cuda_device_index(const std::string& device) {
    if (device == "cuda") return 0;
    if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 8) return -1;
    for (size_t i = 5; i < device.size(); ++i)
        if (device[i] < '0' || device[i] > '9') return -1;
    return std::stoi(device.substr(5));
}

int64_t host_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

void EngineConfig::validate() const {
    auto one_of = [](const std::string& v, std::initializer_list<const char*> names) {
        for (const char* n : names)
            if (v == n) return true;
        return false;
    };
    if (!one_of(load_format, {"auto", "dummy"})) fail("load_format must be auto or dummy, got '", load_format, "'");
    if (!one_of(device, {"auto", "cuda", "cpu"}) && cuda_device_index(device) < 0)
        fail("device must be auto, cuda, cuda:K (a GPU index) or cpu, got '", device, "'");
    if (!one_of(dtype, {"auto", "float32", "bfloat16", "float16", "half"}))
        fail("dtype must be auto, float32, bfloat16 or float16 (half), got '", dtype, "'");
    if (!one_of(kv_eviction, {"lru", "lfu", "fifo"}))
        fail("kv_eviction must be lru, lfu or fifo, got '", kv_eviction, "'");
    if (!one_of(quantization, {"none", "fp8"})) fail("quantization must be none or fp8, got '", quantization, "'");
    if (fp8_lm_head && quantization != "fp8")
        fail("--fp8-lm-head quantizes the LM head with the layers: it needs --quantization fp8, got '", quantization,
             "'");
    if (!one_of(task, {"generate", "embed"})) fail("task must be generate or embed, got '", task, "'");
    if (!one_of(pooling_type, {"", "last", "mean", "cls"}))
        fail("pooling_type must be last, mean or cls, got '", pooling_type, "'");
    if (normalize < -1 || normalize > 1) fail("normalize must be -1 (the model's), 0 or 1, got ", normalize);
    if (task == "embed" && pipeline_parallel_size > 1)
        fail("task embed is not supported with pipeline parallelism (the last stage holds the hidden states)");
    if (threads < 0) fail("threads must be >= 0 (0 = one per core), got ", threads);
    if (!(gpu_memory_utilization >= 0.05 && gpu_memory_utilization <= 1.0))
        fail("gpu_memory_utilization must be in [0.05, 1], got ", gpu_memory_utilization);
    if (block_size < 1 || block_size > 1024) fail("block_size must be in [1, 1024], got ", block_size);
    if (kv_cache_memory < 0) fail("kv_cache_memory must be >= 0, got ", kv_cache_memory);
    if (!one_of(kv_cache_dtype, {"auto", "bf16", "bfloat16", "fp8", "fp8_e4m3"}))
        fail("kv_cache_dtype must be auto, bf16 or fp8 (fp8_e4m3), got '", kv_cache_dtype, "'");
    if (!preemption_mode.empty() && preemption_mode != "swap" && preemption_mode != "recompute")
        fail("preemption_mode must be swap or recompute, got '", preemption_mode, "'");
    if (preemption_mode == "swap" && kv_offload_memory <= 0)
        fail("preemption_mode swap needs a host tier to swap to (kv_offload_memory > 0)");
    if (kv_offload_memory < 0) fail("kv_offload_memory must be >= 0 bytes (0 = no host tier), got ", kv_offload_memory);
    if (kv_offload_memory > 0) {
        const int64_t physical = host_memory_bytes();
        if (physical > 0 && kv_offload_memory > physical)
            fail("kv_offload_memory ", kv_offload_memory, " bytes is more than this host's memory (", physical,
                 " bytes)");
        if (!prefix_caching) fail("kv_offload_memory needs prefix caching (it keeps the prefix cache's blocks)");
    }
    if (!kv_offload_disk.empty() || kv_offload_disk_size != 0) {
        if (kv_offload_disk.empty()) fail("--kv-offload-disk-size needs --kv-offload-disk PATH (a directory)");
        if (kv_offload_disk_size <= 0)
            fail("--kv-offload-disk ", kv_offload_disk, " needs --kv-offload-disk-size BYTES > 0, got ",
                 kv_offload_disk_size);
        if (kv_offload_memory <= 0)
            fail("--kv-offload-disk needs a host tier to read its blocks back through (--kv-offload-memory BYTES)");
        if (parallel_size() > 1)
            fail("--kv-offload-disk is not supported with tensor or pipeline parallelism yet (the host tier is)");
        struct stat st {};
        if (::stat(kv_offload_disk.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
            ::access(kv_offload_disk.c_str(), W_OK | X_OK) != 0)
            fail("--kv-offload-disk ", kv_offload_disk, " is not a writable directory");
    }
    if (max_num_seqs < 0) fail("max_num_seqs must be >= 1 (0: by the device), got ", max_num_seqs);
    if (tensor_parallel_size < 1 || tensor_parallel_size > 64)
        fail("tensor_parallel_size must be in [1, 64], got ", tensor_parallel_size);
    if (pipeline_parallel_size < 1 || pipeline_parallel_size > 64)
        fail("pipeline_parallel_size must be in [1, 64], got ", pipeline_parallel_size);
    if (nnodes < 0) fail("nnodes must be >= 1 (0: from the environment), got ", nnodes);
    if (master_port < 0 || master_port > 65535) fail("master_port must be in [1, 65535] (0: 29500), got ", master_port);
    if (generation_config.empty())
        fail("generation_config must be auto, vllm or a folder with generation_config.json, got ''");
    if (max_model_len < 0) fail("max_model_len must be >= 0 (0 = the model's context), got ", max_model_len);
    if (max_num_batched_tokens < 0)
        fail("max_num_batched_tokens must be >= 1 (0: by the device), got ", max_num_batched_tokens);
}

void EngineConfig::apply_device_defaults(size_t device_bytes) {
    // vLLM's rule (its defaults for H100 / H200-class GPUs); a smaller GPU or the CPU keeps the
    // step small, where a bigger batch buys little and costs memory and latency.
    const bool big = device_bytes >= (size_t{70} << 30);
    if (max_num_seqs == 0) max_num_seqs = big ? 1024 : 256;
    if (max_num_batched_tokens == 0) {
        max_num_batched_tokens = big ? 8192 : 2048;
        step_tokens_by_device = big;
    }
}

// H100, `bench serve` of the 1B shape (16 layers of ~61M product weights), 2,048 requests of
// 128 + 128 tokens, warm server, 2026-11-27: at concurrency 256 8192 tokens a step gave p99 TTFT
// 205-221 ms at 63.8-64.3k output tok/s, 32768 tokens 166-188 ms at 70.3-70.6k (a wave of 256
// prompts is 32K tokens: one step instead of four), TPOT p50 3.08 -> 2.49-2.52 ms; at 64 both
// stay under 80 ms. A step's prefill costs about tokens x weights, so the budget that keeps a
// step's time near the 8B's at 8192 tokens grows as the weights shrink.
void EngineConfig::apply_model_defaults(int64_t layer_weights) {
    if (!step_tokens_by_device || layer_weights <= 0) return;
    constexpr double kReference = 8192.0 * 7.0e9;  // tokens x weights of the 8B's default step
    int tokens = 8192;
    while (tokens < 32768 && 2.0 * tokens * static_cast<double>(layer_weights) <= kReference) tokens *= 2;
    max_num_batched_tokens = tokens;
    step_tokens_by_device = false;
}

}  // namespace peregrine
