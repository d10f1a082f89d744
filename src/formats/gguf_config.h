// GGUF metadata (`general.architecture`, `<arch>.*`, `tokenizer.ggml.*`) → ModelConfig.
#pragma once

#include "formats/gguf.h"
#include "model/model_config.h"

namespace peregrine {

// Throws Error naming the file and key on anything missing or unsupported. Tensor-derived
// facts (q/k/v biases, tied output, rope_freqs) are filled in by the loader.
ModelConfig read_gguf_config(const GgufFile& gguf);

}  // namespace peregrine
