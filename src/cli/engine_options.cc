#include "cli/engine_options.h"

#include <unistd.h>

#include <cstdio>
#include <functional>

#include "cli/pinned_chat.h"

namespace peregrine::cli {

namespace {

// Weight-loading progress on stderr for models of 1 GB or more: on a terminal one line
// redrawn at each percent; otherwise (a log) a plain line at each quarter.
std::function<void(size_t, size_t)> progress_printer() {
    const bool tty = ::isatty(STDERR_FILENO);
    return [tty, last = -1](size_t done, size_t total) mutable {
        if (total < 1000000000) return;
        const int pct = static_cast<int>(100.0 * done / total);
        const int step = tty ? pct : pct / 25 * 25;
        if (step == last) return;
        last = step;
        std::fprintf(stderr,
                     tty ? "\rloading weights: %3d%% (%.1f / %.1f GB)%s" : "loading weights: %d%% (%.1f / %.1f GB)%s",
                     step, done / 1e9, total / 1e9, tty ? (done >= total ? "\n" : "") : "\n");
    };
}

}  // namespace

void add_engine_options(CLI::App* cmd, EngineConfig& o) {
    o.load_progress = progress_printer();
    cmd->add_option("--model", o.model,
                    "Model folder (config.json + safetensors) or GGUF file; default: the embedded stories260K");
    cmd->add_option("--tokenizer", o.tokenizer,
                    "Tokenizer: a folder with tokenizer.json, a tokenizer.json file, or a GGUF whose vocabulary is "
                    "used, e.g. for a --load-format dummy model of any shape (default: the model's own)");
    cmd->add_option("--max-model-len", o.max_model_len,
                    "Tokens of one sequence (prompt + completion) at most; refused at start when one sequence does "
                    "not fit the KV cache (default: the model's context, lowered with a warning to what the KV "
                    "cache holds)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--generation-config", o.generation_config,
                    "Sampling defaults of requests that leave them out: auto (the model's generation_config.json), "
                    "vllm (built-in defaults) or a folder with a generation_config.json (default auto)");
    cmd->add_option("--threads", o.threads, "CPU threads (default: one per core)");
    cmd->add_option("--dtype", o.dtype,
                    "Activation precision: float32 (reference), bfloat16 (bf16 matmul inputs for bf16 weights), "
                    "auto (float32 for now), float16 | half (accepted; no backend has an f16 path yet, so it is "
                    "refused with a message) (default auto)")
        ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16", "half"}));
    cmd->add_option("--block-size", o.block_size, "Tokens per KV-cache block (default 16)")->check(CLI::Range(1, 1024));
    cmd->add_option("--kv-cache-memory", o.kv_cache_memory,
                    "KV-cache bytes (default: room for max-num-seqs full contexts, at most 4 GiB)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                    "KV-cache element type: auto (bf16 on CUDA, f32 on the CPU) | bf16 (CUDA) | fp8 (E4M3 with a "
                    "bf16 scale per token and kv head, set when the token is written: about half the bytes of "
                    "bf16, so about twice the tokens in the same memory; fp8_e4m3 is the same). Default auto")
        ->check([](const std::string& v) {
            for (const char* ok : {"auto", "bf16", "bfloat16", "fp8", "fp8_e4m3"})
                if (v == ok) return std::string();
            return std::string("must be auto, bf16 or fp8 (fp8_e4m3)");
        });
    cmd->add_option("--kv-eviction", o.kv_eviction, "Prefix-cache eviction: lru | lfu | fifo (default lru)")
        ->check(CLI::IsMember({"lru", "lfu", "fifo"}));
    cmd->add_option(
           "--kv-offload-memory", o.kv_offload_memory,
           "Host-memory bytes (pinned on CUDA) for the prefix cache's host tier: blocks evicted from the "
           "KV cache are copied there and copied back on a prefix hit (default 0: none); with tensor / pipeline "
           "parallelism each rank pins this much for its slice")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--kv-offload-disk", o.kv_offload_disk,
                    "A directory for the prefix cache's disk tier, below the host tier (needs --kv-offload-memory): "
                    "blocks evicted from the host tier are written to one preallocated file there and read back "
                    "on a prefix hit (default: none)");
    cmd->add_option("--kv-offload-disk-size", o.kv_offload_disk_size,
                    "Bytes of the disk tier's file under --kv-offload-disk (at least one KV block)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--preemption-mode", o.preemption_mode,
                    "What a sequence preempted for memory loses: swap (its KV blocks go to the host tier and come "
                    "back when it resumes; needs --kv-offload-memory) | recompute (default: swap with a host tier, "
                    "else recompute)")
        ->check(CLI::IsMember({"swap", "recompute"}));
    cmd->add_option("--pin-prefix", o.pin_prefix,
                    "A file whose text is prefilled at start and kept in the KV cache for good (a system-prompt "
                    "cache): plain text, or {\"messages\": [...]} rendered with the chat template. Repeatable; "
                    "the pins may take at most half the KV cache")
        ->check(CLI::ExistingFile)
        ->allow_extra_args(false);  // one file each time: never the positional arguments after it
    // serve replaces it with one that honours its --chat-template.
    o.render_pinned_chat = [](const std::string& messages, const ModelInfo& model, const Tokenizer& tok) {
        return render_pinned_chat(messages, "", model, tok);
    };
    cmd->add_flag_callback(
        "--no-prefix-caching", [&o] { o.prefix_caching = false; }, "Do not reuse KV blocks across requests");
    cmd->add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                    "Token budget of one step (default: on a GPU of >= 70 GiB 8192 for an 8B, up to 32768 for smaller "
                    "models, else 2048)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--max-num-seqs", o.max_num_seqs,
                    "Sequences in one step at most (default: 1024 on a GPU of >= 70 GiB, else 256)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--device", o.device, "cuda | cuda:K (GPU K) | cpu | auto (default: cuda when a GPU is present)")
        ->check([](const std::string& d) {
            return d == "auto" || d == "cpu" || cuda_device_index(d) >= 0 ? std::string()
                                                                          : "must be auto, cpu, cuda or cuda:K";
        });
    cmd->add_option("--load-format", o.load_format,
                    "auto (read the weights) | dummy (random weights of the model's shape, for benchmarks)")
        ->check(CLI::IsMember({"auto", "dummy"}));
    cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                    "Share of GPU memory for weights, activations and the KV cache (default 0.9)")
        ->check(CLI::Range(0.05, 1.0));
    cmd->add_flag("--enforce-eager", o.enforce_eager, "CUDA: run every step eagerly (no CUDA graphs)");
    cmd->add_flag_callback(
        "--no-async-scheduling", [&o] { o.async_scheduling = false; },
        "CUDA: wait for each step's tokens before queueing the next (default: the next step is "
        "queued first, taking the tokens on the device)");
    cmd->add_flag("--batch-invariant", o.batch_invariant,
                  "CUDA: batch-invariant kernels: a request's tokens do not depend on what else is in the batch "
                  "or on how its prompt was chunked (greedy output as when run alone; slower)");
    cmd->add_option("--quantization", o.quantization,
                    "Weights quantized at load: none | fp8 (CUDA: layer matrices to FP8 E4M3 with a factor per "
                    "output row, activations quantized per token; embedding and LM head stay as loaded, unless "
                    "--fp8-lm-head). Default none")
        ->check(CLI::IsMember({"none", "fp8"}));
    cmd->add_flag("--fp8-lm-head", o.fp8_lm_head,
                  "CUDA, with --quantization fp8: the LM head to FP8 too (a tied head as an FP8 copy): fewer bytes "
                  "a decode step (8B: 1.05 -> 0.53 GB), logits less exact");
    cmd->add_flag("--dequantize-gguf", o.dequantize_gguf,
                  "CUDA: convert a GGUF's Q8_0 / Q4_0 / Q4_K / Q6_K matrices to bf16 at load instead of keeping "
                  "them quantized on the GPU (more memory, bf16's product speed)");
    cmd->add_option("--dummy-seed", o.dummy_seed, "Seed of --load-format dummy weights (default 0)");

    // Parallelism (docs/PARALLEL.md); vLLM's and SGLang's spellings.
    cmd->add_option("--tensor-parallel-size", o.tensor_parallel_size,
                    "Ranks (processes) that split every layer: heads, MLP columns, vocabulary (default 1)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--pipeline-parallel-size", o.pipeline_parallel_size,
                    "Pipeline stages of contiguous layers, one rank each per tensor-parallel rank (default 1)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--nnodes", o.nnodes,
                    "Hosts of a multi-host group, one launched process each (default: $PEREGRINE_NNODES, "
                    "mpirun / PMI / Slurm / LeaderWorkerSet variables, else 1)")
        ->check(CLI::Range(1, 4096));
    cmd->add_option("--node-rank", o.node_rank, "This host's index in [0, nnodes) (default: from the environment)")
        ->check(CLI::Range(0, 4095));
    cmd->add_option("--master-addr", o.master_addr,
                    "Host of rank 0, where the group's rendezvous store listens (default: $PEREGRINE_MASTER_ADDR, "
                    "else 127.0.0.1 for one host)");
    cmd->add_option("--master-port", o.master_port, "Port of rank 0's rendezvous store (default 29500)")
        ->check(CLI::Range(1, 65535));
    cmd->add_flag("--disable-custom-all-reduce", o.disable_custom_all_reduce,
                  "CUDA tensor parallelism: every all-reduce through NCCL (default: messages up to 1 MiB between "
                  "GPUs of one host go through a one-shot kernel over peer memory)");
}

}  // namespace peregrine::cli
