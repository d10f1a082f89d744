#include "model/model_config.h"

#include "core/error.h"

namespace peregrine {

void ModelConfig::validate(const std::string& source) const {
    auto positive = [&](int v, const char* key) {
        if (v <= 0) fail(source, ": '", key, "' must be positive, got ", v);
    };
    positive(vocab_size, "vocab_size");
    positive(hidden_size, "hidden_size");
    positive(intermediate_size, "intermediate_size");
    positive(num_layers, "num_hidden_layers");
    positive(num_heads, "num_attention_heads");
    positive(num_kv_heads, "num_key_value_heads");
    positive(head_dim, "head_dim");
    if (num_heads % num_kv_heads != 0)
        fail(source, ": num_attention_heads (", num_heads, ") is not a multiple of num_key_value_heads (", num_kv_heads,
             ")");
    if (rope.rotary_dim <= 0 || rope.rotary_dim > head_dim || rope.rotary_dim % 2 != 0)
        fail(source, ": rotary dimension ", rope.rotary_dim, " does not fit head_dim ", head_dim);
    if (!rope.freq_factors.empty() && static_cast<int>(rope.freq_factors.size()) != rope.rotary_dim / 2)
        fail(source, ": rope_freqs has ", rope.freq_factors.size(), " values, expected ", rope.rotary_dim / 2);
    if (rope.theta <= 0) fail(source, ": rope_theta must be positive");
    if (rope.scaling != RopeScaling::None && rope.factor <= 0) fail(source, ": rope scaling factor must be positive");
    if ((rope.scaling == RopeScaling::Llama3 || rope.scaling == RopeScaling::Yarn) && rope.original_max_position <= 0)
        fail(source, ": rope scaling needs original_max_position_embeddings");
    if (static_cast<int>(layer_window.size()) != num_layers) fail(source, ": layer windows not set for every layer");
}

std::string ModelConfig::summary() const {
    static const char* scalings[] = {"none", "linear", "llama3", "yarn"};
    return str_cat(arch, ": layers ", num_layers, ", hidden ", hidden_size, ", heads ", num_heads, "/", num_kv_heads,
                   " x ", head_dim, ", ffn ", intermediate_size, ", vocab ", vocab_size, ", rope ",
                   scalings[static_cast<int>(rope.scaling)], " theta ", rope.theta,
                   rope.style == RopeStyle::Interleaved ? " (interleaved)" : "", qk_norm ? ", qk-norm" : "",
                   attention_bias ? ", qkv-bias" : "",
                   layer_window.empty() || layer_window[0] == 0 ? "" : str_cat(", window ", layer_window[0]));
}

}  // namespace peregrine
