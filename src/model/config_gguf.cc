#include "model/config_gguf.h"

#include <algorithm>

#include "core/error.h"
#include "model/registry.h"

namespace peregrine {

namespace {

void read_rope(const GgufConfig& m, ModelConfig& cfg) {
    const GgufFile& g = m.file;
    RopeConfig& rope = cfg.rope;
    rope.theta = g.get_float_or(m.key("rope.freq_base"), 10000.0);
    rope.rotary_dim = static_cast<int>(g.get_int_or(m.key("rope.dimension_count"), cfg.head_dim));
    const std::string scaling = g.get_string_or(m.key("rope.scaling.type"), "none");
    if (scaling == "linear") {
        rope.scaling = RopeScaling::Linear;
        rope.factor = g.get_float(m.key("rope.scaling.factor"));
    } else if (scaling == "yarn") {
        rope.scaling = RopeScaling::Yarn;
        rope.factor = g.get_float(m.key("rope.scaling.factor"));
        rope.original_max_position = static_cast<int>(g.get_int(m.key("rope.scaling.original_context_length")));
        rope.beta_fast = g.get_float_or(m.key("rope.scaling.yarn_beta_fast"), 32.0);
        rope.beta_slow = g.get_float_or(m.key("rope.scaling.yarn_beta_slow"), 1.0);
    } else if (scaling != "none") {
        fail(g.path(), ": rope scaling type '", scaling, "' is not supported (none, linear, yarn)");
    }
    // llama3-style scaling arrives as the rope_freqs tensor (read_tensor_facts).
}

// Facts GGUF keeps in the tensor list rather than the metadata.
void read_tensor_facts(const GgufFile& g, const WeightNames& names, ModelConfig& cfg) {
    cfg.attention_bias = g.find_tensor(names.in_layer(0, names.layer.bq)) != nullptr;
    cfg.tie_word_embeddings = g.find_tensor(names.lm_head) == nullptr;
    if (names.rope_freqs && g.find_tensor(names.rope_freqs)) {
        Tensor t = g.tensor(names.rope_freqs);
        if (t.dtype != DType::F32) fail(g.path(), ": tensor '", names.rope_freqs, "' must be f32");
        cfg.rope.freq_factors.assign(t.ptr<float>(), t.ptr<float>() + t.numel());
    }
}

}  // namespace

ModelConfig read_gguf_config(const GgufFile& g) {
    const GgufConfig m{g, g.get_string("general.architecture")};
    const Architecture& arch = detect_architecture(ModelFormat::Gguf, m.arch, g.path());
    ModelConfig cfg;
    cfg.arch = arch.name;

    cfg.hidden_size = static_cast<int>(g.get_int(m.key("embedding_length")));
    cfg.intermediate_size = static_cast<int>(g.get_int(m.key("feed_forward_length")));
    cfg.num_layers = static_cast<int>(g.get_int(m.key("block_count")));
    cfg.num_heads = static_cast<int>(g.get_int(m.key("attention.head_count")));
    cfg.num_kv_heads = static_cast<int>(g.get_int_or(m.key("attention.head_count_kv"), cfg.num_heads));
    if (cfg.num_heads <= 0) fail(g.path(), ": '", m.key("attention.head_count"), "' must be positive");
    cfg.head_dim = static_cast<int>(g.get_int_or(m.key("attention.key_length"), cfg.hidden_size / cfg.num_heads));
    cfg.max_position_embeddings = static_cast<int>(g.get_int_or(m.key("context_length"), 4096));
    cfg.rms_norm_eps = static_cast<float>(g.get_float_or(m.key("attention.layer_norm_rms_epsilon"), 1e-5));
    if (g.has(m.key("vocab_size")))
        cfg.vocab_size = static_cast<int>(g.get_int(m.key("vocab_size")));
    else if (g.has("tokenizer.ggml.tokens"))
        cfg.vocab_size = static_cast<int>(g.get_string_array("tokenizer.ggml.tokens").size());
    else if (const GgufTensorInfo* t = g.find_tensor(arch.gguf_weights->embed))
        cfg.vocab_size = static_cast<int>(t->shape[0]);
    read_rope(m, cfg);

    const int window = static_cast<int>(g.get_int_or(m.key("attention.sliding_window"), 0));
    cfg.layer_window.assign(cfg.num_layers > 0 ? cfg.num_layers : 0, window);

    cfg.bos_token_id = static_cast<int>(g.get_int_or("tokenizer.ggml.bos_token_id", -1));
    for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
        if (g.has(k)) {
            const int id = static_cast<int>(g.get_int(k));
            if (std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), id) == cfg.eos_token_ids.end())
                cfg.eos_token_ids.push_back(id);
        }
    }
    if (arch.read_gguf) arch.read_gguf(m, cfg);
    read_tensor_facts(g, *arch.gguf_weights, cfg);
    cfg.validate(g.path());
    return cfg;
}

}  // namespace peregrine
