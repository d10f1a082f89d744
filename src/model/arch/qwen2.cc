// Qwen2 / Qwen2.5: the llama layout with q/k/v biases (always: its config.json does not say
// so). GGUF files keep Hugging Face's rotate-half rope order; GGUF biases are found in the
// tensor list.
#include "model/arch/llama_family.h"
#include "model/architecture.h"
#include "model/config_hf.h"

namespace peregrine::arch {

extern const Architecture qwen2 = {
    .name = "qwen2",
    .hf_names = {"qwen2", "Qwen2ForCausalLM"},
    .gguf_names = {"qwen2"},
    .read_hf =
        [](const HfConfig& file, ModelConfig& c) {
            c.attention_bias = true;
            hf_window_from_max_window_layers(file, c);
        },
    .read_gguf = nullptr,
    .hf_weights = &kLlamaHfWeights,
    .gguf_weights = &kLlamaGgufWeights,
    .build = build_llama_decoder,
};

}  // namespace peregrine::arch
