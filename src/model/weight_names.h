// Where one file layout keeps a decoder's tensors, by name. An architecture
// (model/architecture.h) holds a table for Hugging Face safetensors and one for GGUF; the
// loader finds every tensor of ModelWeights (model/weights.h) through it.
#pragma once

#include <string>

namespace peregrine {

struct WeightNames {
    // One name per LayerWeights tensor; layer i's is `layer_prefix` + i + "." + the part, e.g.
    // "model.layers." "3" "." "self_attn.q_proj.weight".
    struct Layer {
        const char* attn_norm;  // [hidden]
        const char* wq;         // [num_heads * head_dim, hidden]
        const char* wk;         // [num_kv_heads * head_dim, hidden]
        const char* wv;         // [num_kv_heads * head_dim, hidden]
        const char* bq;         // [num_heads * head_dim]; read when ModelConfig::attention_bias
        const char* bk;         // [num_kv_heads * head_dim]; idem
        const char* bv;         // [num_kv_heads * head_dim]; idem
        const char* q_norm;     // [head_dim]; read when ModelConfig::qk_norm
        const char* k_norm;     // [head_dim]; idem
        const char* wo;         // [hidden, num_heads * head_dim]
        const char* ffn_norm;   // [hidden]
        const char* w_gate;     // [intermediate, hidden]
        const char* w_up;       // [intermediate, hidden]
        const char* w_down;     // [hidden, intermediate]
    };

    const char* embed;       // [vocab, hidden]
    const char* final_norm;  // [hidden]
    const char* lm_head;     // [vocab, hidden]; a file without it ties the head to `embed`
    // [rotary_dim / 2] f32 divisors of the rope frequencies (how GGUF carries llama3 scaling);
    // nullptr where the layout has no such tensor.
    const char* rope_freqs;
    const char* layer_prefix;
    Layer layer;

    // The name of `part` (one of `layer`'s fields) in layer `index`.
    std::string in_layer(int index, const char* part) const {
        return layer_prefix + std::to_string(index) + "." + part;
    }
};

}  // namespace peregrine
