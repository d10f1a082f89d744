// Mistral: the llama layout; config.json's `sliding_window` applies to every layer.
#include "model/arch/llama_family.h"
#include "model/architecture.h"
#include "model/config_gguf.h"
#include "model/config_hf.h"

namespace peregrine::arch {

extern const Architecture mistral = {
    .name = "mistral",
    .hf_names = {"mistral", "MistralForCausalLM"},
    .gguf_names = {"mistral"},
    .read_hf = hf_window_on_every_layer,
    // llama.cpp's converter permutes this arch's q/k rows into Meta's interleaved pairs.
    .read_gguf = [](const GgufConfig&, ModelConfig& c) { c.rope.style = RopeStyle::Interleaved; },
    .hf_weights = &kLlamaHfWeights,
    .gguf_weights = &kLlamaGgufWeights,
    .build = build_llama_decoder,
};

}  // namespace peregrine::arch
