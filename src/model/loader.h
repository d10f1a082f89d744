// Opens a model (a Hugging Face folder or a GGUF file) into a config and weight views. The
// config readers (model/config_hf.h, model/config_gguf.h) detect the architecture; its registry
// entry (model/registry.h) names the tensors of each layout.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/weights.h"
#include "model/model_config.h"

namespace peregrine {

class GgufFile;
class SafetensorsSet;

struct LoadOptions {
    // Whether the backend's matmul reads a weight dtype directly; others become f32 at load.
    std::function<bool(DType)> matmul_dtype_ok;
    // Called with (bytes done, bytes total) while weights are paged in; may be empty.
    std::function<void(size_t, size_t)> progress;
};

struct LoadedModel {
    std::string path;
    std::string format;  // "safetensors" or "gguf"
    ModelConfig config;
    ModelWeights weights;
    std::string weight_dtypes;       // e.g. "bf16 x 16, f32 x 5" of the matmul weights, for the load log
    std::string model_dir;           // folder holding tokenizer files (HF) or empty (GGUF)
    std::shared_ptr<GgufFile> gguf;  // kept open for the tokenizer; null for HF folders

    ~LoadedModel();

    // Owners of what the weight views point into.
    std::shared_ptr<SafetensorsSet> safetensors;
    std::vector<std::vector<float>> converted;  // tensors converted to f32 at load
    std::shared_ptr<void> backend_memory;       // weights allocated through a backend (dummy load)
};

// `path`: a folder with config.json, a .safetensors file inside one, or a .gguf file.
// Throws Error naming the file and the tensor or key when anything is missing or malformed.
std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& options);

// The config of `path` (as load_model reads it, GGUF tensor-list facts included) and, for GGUF,
// the open file; no weights.
std::unique_ptr<LoadedModel> open_model_config(const std::string& path);

// `--load-format dummy`: the config (and tokenizer) of `path`, with random weights of the
// model's shape allocated through `backend` (matrices in its activation dtype, norms 1 +- 0.1,
// matrices uniform in +-`scale`), as vLLM's dummy format offers: benchmarks need no download.
class Backend;
std::unique_ptr<LoadedModel> load_dummy_model(const std::string& path, Backend& backend, uint64_t seed = 0,
                                              float scale = 0.02f);

// The embedded default model's folder: $PEREGRINE_MODELS or models/ next to the source tree,
// or next to the binary.
std::string default_model_path();

}  // namespace peregrine
