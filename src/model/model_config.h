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

    int q_dim() const { return num_heads * head_dim; }
    int kv_dim() const { return num_kv_heads * head_dim; }
    // Throws Error naming `source` when a value is missing or inconsistent.
    void validate(const std::string& source) const;
    std::string summary() const;
};

}  // namespace peregrine
