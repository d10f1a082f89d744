#include "formats/gguf_config.h"

#include <algorithm>

#include "core/error.h"

namespace peregrine {

ModelConfig read_gguf_config(const GgufFile& g) {
    ModelConfig cfg;
    const std::string arch = g.get_string("general.architecture");
    cfg.arch_name = arch;
    if (arch == "llama")
        cfg.arch = Arch::Llama;
    else if (arch == "mistral")
        cfg.arch = Arch::Mistral;
    else if (arch == "qwen2")
        cfg.arch = Arch::Qwen2;
    else if (arch == "qwen3")
        cfg.arch = Arch::Qwen3;
    else
        fail(g.path(), ": general.architecture '", arch, "' is not supported (llama, mistral, qwen2, qwen3)");
    auto key = [&](const char* k) { return arch + "." + k; };

    cfg.hidden_size = static_cast<int>(g.get_int(key("embedding_length")));
    cfg.intermediate_size = static_cast<int>(g.get_int(key("feed_forward_length")));
    cfg.num_layers = static_cast<int>(g.get_int(key("block_count")));
    cfg.num_heads = static_cast<int>(g.get_int(key("attention.head_count")));
    cfg.num_kv_heads = static_cast<int>(g.get_int_or(key("attention.head_count_kv"), cfg.num_heads));
    if (cfg.num_heads <= 0) fail(g.path(), ": '", key("attention.head_count"), "' must be positive");
    cfg.head_dim = static_cast<int>(g.get_int_or(key("attention.key_length"), cfg.hidden_size / cfg.num_heads));
    cfg.max_position_embeddings = static_cast<int>(g.get_int_or(key("context_length"), 4096));
    cfg.rms_norm_eps = static_cast<float>(g.get_float_or(key("attention.layer_norm_rms_epsilon"), 1e-5));
    if (g.has(key("vocab_size")))
        cfg.vocab_size = static_cast<int>(g.get_int(key("vocab_size")));
    else if (g.has("tokenizer.ggml.tokens"))
        cfg.vocab_size = static_cast<int>(g.get_string_array("tokenizer.ggml.tokens").size());
    else if (const GgufTensorInfo* t = g.find_tensor("token_embd.weight"))
        cfg.vocab_size = static_cast<int>(t->shape[0]);
    cfg.qk_norm = cfg.arch == Arch::Qwen3;

    RopeConfig& rope = cfg.rope;
    rope.theta = g.get_float_or(key("rope.freq_base"), 10000.0);
    rope.rotary_dim = static_cast<int>(g.get_int_or(key("rope.dimension_count"), cfg.head_dim));
    // llama.cpp's converter permutes the llama arch's q/k rows into Meta's interleaved pairs;
    // qwen files keep Hugging Face's rotate-half order.
    rope.style = (cfg.arch == Arch::Llama || cfg.arch == Arch::Mistral) ? RopeStyle::Interleaved : RopeStyle::Neox;
    const std::string scaling = g.get_string_or(key("rope.scaling.type"), "none");
    if (scaling == "linear") {
        rope.scaling = RopeScaling::Linear;
        rope.factor = g.get_float(key("rope.scaling.factor"));
    } else if (scaling == "yarn") {
        rope.scaling = RopeScaling::Yarn;
        rope.factor = g.get_float(key("rope.scaling.factor"));
        rope.original_max_position = static_cast<int>(g.get_int(key("rope.scaling.original_context_length")));
        rope.beta_fast = g.get_float_or(key("rope.scaling.yarn_beta_fast"), 32.0);
        rope.beta_slow = g.get_float_or(key("rope.scaling.yarn_beta_slow"), 1.0);
    } else if (scaling != "none") {
        fail(g.path(), ": rope scaling type '", scaling, "' is not supported (none, linear, yarn)");
    }
    // llama3-style scaling arrives as the `rope_freqs.weight` tensor, read by the loader.

    const int window = static_cast<int>(g.get_int_or(key("attention.sliding_window"), 0));
    cfg.layer_window.assign(cfg.num_layers > 0 ? cfg.num_layers : 0, window);

    cfg.bos_token_id = static_cast<int>(g.get_int_or("tokenizer.ggml.bos_token_id", -1));
    for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
        if (g.has(k)) {
            const int id = static_cast<int>(g.get_int(k));
            if (std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), id) == cfg.eos_token_ids.end())
                cfg.eos_token_ids.push_back(id);
        }
    }
    return cfg;
}

}  // namespace peregrine
