// Qwen3 (dense): the llama layout with a per-head RMSNorm of q and k before RoPE (qk-norm).
// GGUF files keep Hugging Face's rotate-half rope order.
#include "model/arch/llama_family.h"
#include "model/architecture.h"
#include "model/config_gguf.h"
#include "model/config_hf.h"

namespace peregrine::arch {

extern const Architecture qwen3 = {
    .name = "qwen3",
    .hf_names = {"qwen3", "Qwen3ForCausalLM"},
    .gguf_names = {"qwen3"},
    .read_hf =
        [](const HfConfig& file, ModelConfig& c) {
            c.qk_norm = true;
            hf_window_from_max_window_layers(file, c);
        },
    .read_gguf = [](const GgufConfig&, ModelConfig& c) { c.qk_norm = true; },
    .hf_weights = &kLlamaHfWeights,
    .gguf_weights = &kLlamaGgufWeights,
    .build = build_llama_decoder,
};

}  // namespace peregrine::arch
