// What a caller chooses when it builds an engine (Engine::create), and the counters it reads
// back. Every field has the default `peregrine serve` uses; the CLI only maps flags onto it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "peregrine/engine_types.h"

namespace peregrine {

struct ModelInfo;
class Tokenizer;

struct EngineConfig {
    // --- the model
    std::string model;                 // a folder (config.json + safetensors) or a .gguf; empty: the embedded model
    std::string load_format = "auto";  // auto (read the weights) | dummy (random weights of the model's shape)
    uint64_t dummy_seed = 0;           // seed of dummy weights
    // Tokens of one sequence (prompt + completion) at most. 0: the model's context
    // (max_position_embeddings), lowered with a warning to what the KV cache holds for one
    // sequence. Set explicitly, it must fit both, or Engine::create throws naming the numbers.
    int max_model_len = 0;
    // Where the tokenizer comes from: a folder with tokenizer.json, a tokenizer.json, or a GGUF
    // whose vocabulary is used. Empty: the model's own. Checked before the weights load.
    std::string tokenizer;
    // Sampling defaults of requests that leave them out: "auto" (the model's
    // generation_config.json), "vllm" (none: the built-in defaults) or a folder holding a
    // generation_config.json.
    std::string generation_config = "auto";
    // What requests the engine serves: "generate" (text) or "embed" (vectors pooled from the
    // final hidden states: Request::pooling; vLLM's --task embed). For embed, the pooling comes
    // from these when set, else from the model folder's sentence-transformers files (modules.json,
    // 1_Pooling/config.json, a Normalize module), else last-token for qwen3 and mean otherwise,
    // normalised: ModelInfo::pooling holds the result.
    std::string task = "generate";
    std::string pooling_type;  // "" (the model's) | last | mean | cls
    int normalize = -1;        // -1: the model's; 0: raw vectors; 1: L2-normalised
    // Called with (bytes done, bytes total) while weights are paged in; may be empty.
    std::function<void(size_t, size_t)> load_progress;

    // --- the device
    std::string device = "auto";          // auto (cuda when a GPU is present) | cuda | cuda:K (GPU K) | cpu
    int threads = 0;                      // CPU threads; 0 = one per core
    std::string dtype = "auto";           // CPU activation precision: auto | float32 | bfloat16
    double gpu_memory_utilization = 0.9;  // CUDA: share of GPU memory for weights, activations and KV cache
    bool enforce_eager = false;           // CUDA: no graph recording
    bool batch_invariant = false;         // CUDA: a request's tokens do not depend on the rest of the batch
    // Weight quantization applied at load: "none" or "fp8" (CUDA: every layer matrix to E4M3 with
    // a factor per output row; the embedding and LM head stay as loaded).
    std::string quantization = "none";
    // With quantization "fp8": the LM head too (E4M3 rows, a factor each; a tied head gets an FP8
    // copy, the embedding stays as loaded). Fewer bytes a decode step, logits less exact.
    bool fp8_lm_head = false;
    // CUDA: GGUF Q8_0 / Q4_0 / Q4_K / Q6_K matrices become bf16 on the device, as before they
    // stayed quantized (more memory; bf16's product speed). The CPU refuses it.
    bool dequantize_gguf = false;

    // --- the KV cache
    int block_size = 16;          // tokens per block
    int64_t kv_cache_memory = 0;  // bytes; 0 = CUDA: what the utilisation target leaves, CPU: room for
                                  // max_num_seqs full contexts, at most 4 GiB
    // Element type of the KV cache: auto (the backend's: bf16 on CUDA, f32 on the CPU) | bf16
    // (CUDA) | fp8 (E4M3 codes with a bf16 scale per token and kv head, core/kv_fp8.h: about half
    // the bytes of bf16 a token, so about twice the tokens in the same memory). fp8_e4m3 and
    // bfloat16 are accepted as vLLM spells them.
    std::string kv_cache_dtype = "auto";
    std::string kv_eviction = "lru";  // prefix-cache eviction: lru | lfu | fifo
    bool prefix_caching = true;
    // Bytes of host memory (pinned on CUDA) for the prefix cache's host tier: committed blocks
    // evicted from the KV pool are copied there and copied back on a prefix hit. 0 = none.
    int64_t kv_offload_memory = 0;
    // A directory for the prefix cache's disk tier (below the host tier, which it needs): blocks
    // evicted from the host tier are written to one preallocated file of kv_offload_disk_size
    // bytes there and read back on a prefix hit. Empty = none.
    std::string kv_offload_disk;
    int64_t kv_offload_disk_size = 0;
    // What a preempted sequence loses: "swap" (its blocks go to the host tier and come back when it
    // resumes; needs kv_offload_memory) or "recompute" (freed; its prompt and output run again).
    // Empty: swap with a host tier, else recompute.
    std::string preemption_mode;
    // Files whose text is prefilled at start and kept in the KV cache for good (a system-prompt
    // cache; engine/pinned_prefix.h): plain text, or a chat JSON {"messages": [...]} that
    // render_pinned_chat turns into the prompt text.
    std::vector<std::string> pin_prefix;
    // (messages as JSON text, the model, its tokenizer) -> the prompt text of those messages under
    // the chat template, without the generation prompt. Set by the front end that owns chat
    // templates (the CLI); empty: chat files are refused.
    std::function<std::string(const std::string&, const ModelInfo&, const Tokenizer&)> render_pinned_chat;

    // --- the scheduler
    // Sequences and tokens in one step at most; 0 = by the device (apply_device_defaults): on a
    // GPU of >= 70 GiB 1024 and 8192 (as vLLM; the 8B shape's offline throughput on an H100 is
    // capped at 256 sequences), the tokens then scaled up for a smaller model
    // (apply_model_defaults), else 256 and 2048.
    int max_num_seqs = 0;
    int max_num_batched_tokens = 0;
    // Set by apply_device_defaults when it chose max_num_batched_tokens for a big GPU.
    bool step_tokens_by_device = false;
    // With device sampling, queue step N+1 before step N's tokens come back.
    bool async_scheduling = true;
    // Seed of the requests that give none: request k (in submission order) draws from a seed
    // derived from (seed, k), so one run's requests reproduce in another. -1: random per request.
    int64_t seed = -1;

    // --- prefix-cache events (vLLM's KV events): called on the engine's thread after each step
    // that changed the prefix cache, with that step's events in order. Must return at once (queue
    // them). Empty: no events are recorded.
    std::function<void(std::vector<KvCacheEvent>)> kv_events;

    // --- parallelism: one process per rank (docs/PARALLEL.md). With tensor_parallel_size *
    // pipeline_parallel_size > 1, Engine::create joins (rank 0 of the group: first spawns this
    // host's other ranks) a group of that many processes; it returns only on rank 0, and every
    // other rank serves the group inside it and exits the process when the group stops.
    int tensor_parallel_size = 1;    // ranks that split every layer (heads, MLP columns, vocabulary)
    int pipeline_parallel_size = 1;  // stages of contiguous layers
    // Several hosts: one launched process per host (vLLM / SGLang spelling). Unset values (0,
    // -1, empty) come from PEREGRINE_NNODES / _NODE_RANK / _MASTER_ADDR / _MASTER_PORT, then
    // mpirun's, PMI's, Slurm's or a LeaderWorkerSet's variables; none: this host alone.
    int nnodes = 0;
    int node_rank = -1;
    std::string master_addr;  // rank 0's host, where its rendezvous store listens
    int master_port = 0;      // 0: 29500
    // CUDA tensor parallelism on one host: every all-reduce through NCCL, not the peer-memory
    // one-shot kernel used for small messages (vLLM's --disable-custom-all-reduce).
    bool disable_custom_all_reduce = false;

    int parallel_size() const { return tensor_parallel_size * pipeline_parallel_size; }

    // Throws Error naming the field when a value is out of range or unknown.
    void validate() const;
    // Fills max_num_seqs / max_num_batched_tokens left at 0 for a device of `device_bytes` of
    // memory of its own (0: the CPU, whose memory is the host's).
    void apply_device_defaults(size_t device_bytes);
    // After apply_device_defaults, once the model is known: where the step's token budget is the
    // big GPU's default, a model whose layers hold fewer product weights per GPU than the 8B's
    // (~7e9) gets proportionally more tokens a step (a power of two, at most 32768), so that a
    // full step costs about what 8192 tokens cost the 8B. `layer_weights` counts this rank's.
    void apply_model_defaults(int64_t layer_weights);
};

// The GPU index `device` names: "cuda" 0, "cuda:K" K; -1 for anything else.
int cuda_device_index(const std::string& device);
// This host's physical memory in bytes (0 when the system does not say).
int64_t host_memory_bytes();

struct EngineStats {
    int num_running = 0;
    int num_waiting = 0;  // sequences, an n > 1 request not started yet counted as n
    int num_kv_blocks = 0;
    int num_kv_blocks_used = 0;
    int block_size = 0;           // tokens per KV block
    uint64_t prefix_queries = 0;  // tokens
    uint64_t prefix_hits = 0;     // tokens
    uint64_t evictions = 0;       // device-pool blocks evicted from the prefix cache
    uint64_t preemptions = 0;
    uint64_t swap_preemptions = 0;       // of those, by swapping to the host tier (the rest recompute)
    uint64_t kv_swapped_out_blocks = 0;  // device -> host copies of preempted sequences (in kv_offloaded_blocks)
    uint64_t kv_swapped_in_blocks = 0;   // host -> device copies of resumed ones (in kv_onloaded_blocks)
    // The host tier of the prefix cache (EngineConfig::kv_offload_memory; zeros without one).
    int num_host_kv_blocks = 0;
    int num_host_kv_blocks_used = 0;
    uint64_t host_prefix_queries = 0;   // prompt tokens looked up there (those the device pool missed)
    uint64_t host_prefix_hits = 0;      // of those, tokens found there (also in prefix_hits)
    uint64_t host_evictions = 0;        // host-tier blocks dropped for others
    uint64_t kv_offloaded_blocks = 0;   // device -> host copies
    uint64_t kv_onloaded_blocks = 0;    // host -> device copies
    uint64_t kv_block_bytes = 0;        // one block's K/V, every layer (this process's share)
    std::string kv_cache_dtype;         // the KV cache's element type: f32 | bf16 | f8_e4m3 ("": unknown)
    uint64_t pinned_prefix_tokens = 0;  // tokens of --pin-prefix held in the KV cache for good
    // Requests naming their conversation (prompt_cache_key, or X-Session-ID over HTTP): their
    // blocks are evicted after anonymous ones.
    uint64_t conversation_requests = 0;
    uint64_t prompt_tokens = 0;  // of finished and running requests, counted at submit
    uint64_t generation_tokens = 0;
    uint64_t steps = 0;
    // The disk tier below the host tier (EngineConfig::kv_offload_disk; zeros without one).
    int num_disk_kv_blocks = 0;
    int num_disk_kv_blocks_used = 0;
    uint64_t disk_slot_bytes = 0;         // one block on disk: header + K/V, rounded up to 4 KiB
    uint64_t disk_prefix_queries = 0;     // prompt tokens looked up there (device and host missed)
    uint64_t disk_prefix_hits = 0;        // of those, tokens found there (read back to the host tier)
    uint64_t disk_evictions = 0;          // disk-tier blocks dropped for others
    uint64_t kv_disk_written_blocks = 0;  // host -> disk writes issued
    uint64_t kv_disk_read_blocks = 0;     // disk -> host reads issued
    uint64_t kv_disk_written_bytes = 0;   // bytes of good writes
    uint64_t kv_disk_read_bytes = 0;      // bytes of good reads
    uint64_t disk_write_failures = 0;     // writes failed or skipped (the block dropped)
    uint64_t disk_read_failures = 0;      // reads failed: the block dropped and recomputed
    // Cumulative wall time of the step's phases, seconds.
    double schedule_seconds = 0;     // scheduler + block manager + batch building
    double execute_seconds = 0;      // the model
    double postprocess_seconds = 0;  // sampling and outputs
};

}  // namespace peregrine
