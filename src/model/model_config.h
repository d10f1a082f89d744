// Architecture and hyper-parameters of a llama-family model, whatever file it came from
// (model/config_hf.h and model/config_gguf.h read them).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backend/rope_table.h"

namespace peregrine {

enum class RopeScaling { None, Linear, Llama3, Yarn };

struct RopeConfig {
    double theta = 10000.0;
    int rotary_dim = 0;  // dimensions rotated per head (= head_dim for the llama family)
    RopeStyle style = RopeStyle::Neox;
    RopeScaling scaling = RopeScaling::None;
    double factor = 1.0;
    int original_max_position = 0;    // llama3 / yarn: the context the model was trained on
    double low_freq_factor = 1.0;     // llama3
    double high_freq_factor = 4.0;    // llama3
    double beta_fast = 32.0;          // yarn
    double beta_slow = 1.0;           // yarn
    double attention_factor = -1;     // yarn: scales cos/sin; < 0 means derive from factor (and mscale)
    double mscale = 0;                // yarn (deepseek-style); 0 = unset
    double mscale_all_dim = 0;        // yarn; 0 = unset
    bool truncate = true;             // yarn: round the correction range to whole dims
    std::vector<float> freq_factors;  // GGUF rope_freqs: inv_freq[i] /= freq_factors[i]; [rotary_dim / 2]
};

// A rank's place in a tensor-parallel group (Megatron-style: one process per rank, each holding
// a slice of every layer). size 1 = the whole model in one rank.
struct TensorParallel {
    int rank = 0;  // in [0, size)
    int size = 1;
};

// A rank's pipeline stage: stage `stage` of `stages`, each running a contiguous range of layers.
struct PipelineStage {
    int stage = 0;  // in [0, stages)
    int stages = 1;
};

// The layers pipeline stage `stage` of `stages` runs: [first, first + count), contiguous, the
// first L % stages stages taking one layer more. Throws Error when there are fewer layers than
// stages.
struct StageLayers {
    int first = 0, count = 0;
    bool contains(int layer) const { return layer >= first && layer < first + count; }
};
StageLayers stage_layers(int num_layers, int stage, int stages);

struct ModelConfig {
    // The registry's name for the architecture (model/registry.h): "llama", "qwen2", ...
    std::string arch = "llama";
    int vocab_size = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_layers = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    int max_position_embeddings = 0;
    float rms_norm_eps = 1e-6f;
    bool tie_word_embeddings = false;
    bool attention_bias = false;  // q/k/v biases (qwen2)
    bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (qwen3)
    // Sliding-window size per layer; 0 = full attention. A query at position p sees keys in
    // (p - window, p].
    std::vector<int> layer_window;
    RopeConfig rope;

    int bos_token_id = -1;
    std::vector<int> eos_token_ids;
    // Sampling defaults the model's authors recommend (generation_config.json); unset when absent.
    struct GenerationDefaults {
        std::optional<float> temperature, top_p, min_p, repetition_penalty;
        std::optional<int> top_k;
    } generation_defaults;

    // The rank's place when this config is one rank's shard (shard_config); the head and
    // intermediate counts above are then the rank's, while vocab_size stays the full vocabulary.
    TensorParallel tp;

    // The rank's rows of the vocabulary-parallel embedding and LM head: [vocab_begin(),
    // vocab_end()), vocab_size / tp.size rows each, the last rank also taking the remainder.
    // [0, vocab_size) with tp.size 1.
    int vocab_begin() const { return tp.rank * (vocab_size / tp.size); }
    int vocab_end() const { return tp.rank == tp.size - 1 ? vocab_size : (tp.rank + 1) * (vocab_size / tp.size); }
    int vocab_rows() const { return vocab_end() - vocab_begin(); }

    int q_dim() const { return num_heads * head_dim; }
    int kv_dim() const { return num_kv_heads * head_dim; }
    // Throws Error naming `source` when a value is missing or inconsistent.
    void validate(const std::string& source) const;
    std::string summary() const;
};

// Rank `tp.rank`'s config for Megatron-style tensor parallelism over `tp.size` ranks:
// num_heads / T query heads (rank r: heads [r H/T, (r+1) H/T)), intermediate_size / T, and
// num_kv_heads / T kv heads, or, when T exceeds num_kv_heads (T a multiple of it), one kv head
// replicated across the T / num_kv_heads ranks whose query heads read it (shard_kv_head).
// vocab_size stays the full vocabulary (vocab_begin / vocab_end give the rank's rows).
// T = 1 returns `full` unchanged. Throws Error naming the numbers when the heads, the kv heads
// or the intermediate size do not divide among T ranks, or when the rank is out of range; the
// message starts with "<source>: " when `source` (the model's path) is given.
ModelConfig shard_config(const ModelConfig& full, TensorParallel tp, const std::string& source = "");

// The first of `full`'s kv heads that rank `tp.rank` holds: r * (KV / T) when T <= KV, else the
// one kv head its first query head (r * H / T) reads, (r * H / T) / (H / KV).
int shard_kv_head(const ModelConfig& full, TensorParallel tp);

}  // namespace peregrine
