#include "model/arch/llama_family.h"

#include "model/llama.h"

namespace peregrine {

const WeightNames kLlamaHfWeights = {
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm.weight",
    .lm_head = "lm_head.weight",
    .rope_freqs = nullptr,
    .layer_prefix = "model.layers.",
    .layer =
        {
            .attn_norm = "input_layernorm.weight",
            .wq = "self_attn.q_proj.weight",
            .wk = "self_attn.k_proj.weight",
            .wv = "self_attn.v_proj.weight",
            .bq = "self_attn.q_proj.bias",
            .bk = "self_attn.k_proj.bias",
            .bv = "self_attn.v_proj.bias",
            .q_norm = "self_attn.q_norm.weight",
            .k_norm = "self_attn.k_norm.weight",
            .wo = "self_attn.o_proj.weight",
            .ffn_norm = "post_attention_layernorm.weight",
            .w_gate = "mlp.gate_proj.weight",
            .w_up = "mlp.up_proj.weight",
            .w_down = "mlp.down_proj.weight",
        },
};

const WeightNames kLlamaGgufWeights = {
    .embed = "token_embd.weight",
    .final_norm = "output_norm.weight",
    .lm_head = "output.weight",
    .rope_freqs = "rope_freqs.weight",
    .layer_prefix = "blk.",
    .layer =
        {
            .attn_norm = "attn_norm.weight",
            .wq = "attn_q.weight",
            .wk = "attn_k.weight",
            .wv = "attn_v.weight",
            .bq = "attn_q.bias",
            .bk = "attn_k.bias",
            .bv = "attn_v.bias",
            .q_norm = "attn_q_norm.weight",
            .k_norm = "attn_k_norm.weight",
            .wo = "attn_output.weight",
            .ffn_norm = "ffn_norm.weight",
            .w_gate = "ffn_gate.weight",
            .w_up = "ffn_up.weight",
            .w_down = "ffn_down.weight",
        },
};

std::unique_ptr<Model> build_llama_decoder(const LoadedModel& loaded, Backend& backend, const ModelParallel& par) {
    return std::make_unique<LlamaModel>(loaded, backend, par);
}

}  // namespace peregrine
