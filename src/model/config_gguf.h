// GGUF metadata (`general.architecture`, `<arch>.*`, `tokenizer.ggml.*`) and the facts GGUF
// keeps in its tensor list (q/k/v biases, a tied output, rope_freqs) → ModelConfig. The keys
// every architecture shares are read here; the architecture's read_gguf hook
// (model/architecture.h) adds its own facts.
#pragma once

#include <string>

#include "formats/gguf.h"
#include "model/model_config.h"

namespace peregrine {

// Throws Error naming the file and key or tensor on anything missing or unsupported; the
// result is validated.
ModelConfig read_gguf_config(const GgufFile& gguf);

// The metadata as a read_gguf hook sees it.
struct GgufConfig {
    const GgufFile& file;
    std::string arch;  // `general.architecture` as written: the prefix of the model's keys

    // "<arch>.<k>", e.g. key("attention.head_count") = "qwen2.attention.head_count".
    std::string key(const char* k) const { return arch + "." + k; }
};

}  // namespace peregrine
