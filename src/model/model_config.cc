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

namespace {

ModelConfig shard(const ModelConfig& full, TensorParallel tp) {
    const int T = tp.size;
    if (T < 1) fail("tensor parallel size must be at least 1, got ", T);
    if (tp.rank < 0 || tp.rank >= T) fail("tensor parallel rank ", tp.rank, " is outside [0, ", T, ")");
    if (T == 1) return full;
    if (full.num_heads % T != 0)
        fail("num_attention_heads (", full.num_heads, ") is not divisible by the tensor parallel size (", T, ")");
    if (full.intermediate_size % T != 0)
        fail("intermediate_size (", full.intermediate_size, ") is not divisible by the tensor parallel size (", T, ")");
    if (full.num_kv_heads % T != 0 && T % full.num_kv_heads != 0)
        fail("num_key_value_heads (", full.num_kv_heads, ") and the tensor parallel size (", T,
             ") do not divide one another (each rank needs whole kv heads, or one replicated)");
    if (full.vocab_size < T)
        fail("vocab_size (", full.vocab_size, ") is smaller than the tensor parallel size (", T, ")");
    ModelConfig c = full;
    c.tp = tp;
    c.num_heads = full.num_heads / T;
    c.num_kv_heads = full.num_kv_heads >= T ? full.num_kv_heads / T : 1;
    c.intermediate_size = full.intermediate_size / T;
    return c;
}

}  // namespace

StageLayers stage_layers(int num_layers, int stage, int stages) {
    PG_CHECK(stages >= 1 && stage >= 0 && stage < stages);
    if (num_layers < stages)
        fail("pipeline parallelism over ", stages, " stages needs at least ", stages, " layers; the model has ",
             num_layers);
    const int base = num_layers / stages, extra = num_layers % stages;
    return {stage * base + std::min(stage, extra), base + (stage < extra ? 1 : 0)};
}

ModelConfig shard_config(const ModelConfig& full, TensorParallel tp, const std::string& source) {
    if (source.empty()) return shard(full, tp);
    try {
        return shard(full, tp);
    } catch (const Error& e) {
        fail(source, ": ", e.what());
    }
}

int shard_kv_head(const ModelConfig& full, TensorParallel tp) {
    if (full.num_kv_heads >= tp.size) return tp.rank * (full.num_kv_heads / tp.size);
    const int first_q_head = tp.rank * (full.num_heads / tp.size);
    return first_q_head / (full.num_heads / full.num_kv_heads);
}

std::string ModelConfig::summary() const {
    static const char* scalings[] = {"none", "linear", "llama3", "yarn"};
    return str_cat(arch, ": layers ", num_layers, ", hidden ", hidden_size, ", heads ", num_heads, "/", num_kv_heads,
                   " x ", head_dim, ", ffn ", intermediate_size, ", vocab ", vocab_size, ", rope ",
                   scalings[static_cast<int>(rope.scaling)], " theta ", rope.theta,
                   rope.style == RopeStyle::Interleaved ? " (interleaved)" : "", qk_norm ? ", qk-norm" : "",
                   attention_bias ? ", qkv-bias" : "",
                   layer_window.empty() || layer_window[0] == 0 ? "" : str_cat(", window ", layer_window[0]),
                   tp.size > 1 ? str_cat(", tensor parallel rank ", tp.rank, " of ", tp.size) : "");
}

}  // namespace peregrine
