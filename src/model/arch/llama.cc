// Llama (Meta's Llama 1-3.x and the many models that reuse its layout): the llama family's
// decoder with no q/k/v bias unless config.json asks for it and no qk-norm.
#include "model/arch/llama_family.h"
#include "model/architecture.h"
#include "model/config_gguf.h"
#include "model/config_hf.h"

namespace peregrine::arch {

extern const Architecture llama = {
    .name = "llama",
    .hf_names = {"llama", "LlamaForCausalLM"},
    .gguf_names = {"llama"},
    .read_hf = hf_window_on_every_layer,
    // llama.cpp's converter permutes this arch's q/k rows into Meta's interleaved pairs.
    .read_gguf = [](const GgufConfig&, ModelConfig& c) { c.rope.style = RopeStyle::Interleaved; },
    .hf_weights = &kLlamaHfWeights,
    .gguf_weights = &kLlamaGgufWeights,
    .build = build_llama_decoder,
};

}  // namespace peregrine::arch
