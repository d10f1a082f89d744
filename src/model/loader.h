// Opens a model (a Hugging Face folder or a GGUF file) into a config and weight views. The
// config readers (model/config_hf.h, model/config_gguf.h) detect the architecture; its registry
// entry (model/registry.h) names the tensors of each layout.
#pragma once

#include <cstdint>
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
    // Load only this rank's slices (Megatron-style; see load_model). size 1: the whole model.
    TensorParallel tp;
    // Load only this pipeline stage's layers (stage_layers); the others stay empty.
    PipelineStage pp;
};

struct LoadedModel {
    std::string path;
    std::string format;  // "safetensors" or "gguf"
    ModelConfig config;
    ModelWeights weights;
    std::string weight_dtypes;       // e.g. "bf16 x 16, f32 x 5" of the matmul weights, for the load log
    std::string quantization;        // the checkpoint's quantization for the load log; empty if none
    std::string model_dir;           // folder holding tokenizer files (HF) or empty (GGUF)
    std::shared_ptr<GgufFile> gguf;  // kept open for the tokenizer; null for HF folders

    ~LoadedModel();

    // Owners of what the weight views point into.
    std::shared_ptr<SafetensorsSet> safetensors;
    std::vector<std::vector<float>> converted;  // tensors converted to f32 at load; FP8 row factors
    // Column slices of row-parallel matrices (wo, w_down) copied in their own dtype (whole
    // quantization blocks) under tensor parallelism; FP8 tensors dequantized to bf16 at load.
    std::vector<std::vector<uint8_t>> sliced;
    std::shared_ptr<void> backend_memory;  // weights allocated through a backend (dummy load)

    // A load that makes its layers when they are placed (a lazy dummy load; weights.layers then
    // holds empty layers): make_layer(i) returns layer i's weights, which the model places at
    // once, then hands them to layer_placed with the placed layer, which releases what the
    // placed layer does not point into. So at most one layer's weights exist beside the placed
    // ones. Empty where weights.layers holds every layer.
    std::function<LayerWeights(int)> make_layer;
    std::function<void(const LayerWeights& made, const LayerWeights& placed)> layer_placed;
};

// `path`: a folder with config.json, a .safetensors file inside one, or a .gguf file.
// Throws Error naming the file and the tensor or key when anything is missing or malformed.
//
// With options.tp.size T > 1, `config` is shard_config(full, tp) and `weights` hold only rank
// r's slices, each checked against the file's full shape first (Megatron-style):
//   - wq, bq: the rank's query heads, rows [r Q/T, (r+1) Q/T) (Q = num_heads * head_dim);
//     wk, wv, bk, bv: its kv heads' rows (shard_kv_head; one replicated head when T > kv heads);
//     w_gate, w_up: rows [r F/T, (r+1) F/T). Row blocks are views into the mapping, no copy.
//     GGUF llama/mistral files keep q/k rows in interleaved-pair order, but only within each
//     head, so whole-head row blocks are the same heads as in the Hugging Face layout.
//   - wo, w_down: the matching columns, a strided copy (`sliced`) kept in the file's dtype when
//     the backend's matmul reads it and the split falls on quantization block boundaries (32 for
//     q8_0 / q4_0, 256 for q4_k / q6_k); otherwise dequantized to f32 for the slice (`converted`).
//   - embed and lm_head: the rank's vocabulary rows [config.vocab_begin(), config.vocab_end())
//     (with tied embeddings the same rows serve both); norms whole on every rank.
// T = 1 loads exactly what it loaded before tensor parallelism existed.
std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& options);

// The config of `path` (as load_model reads it, GGUF tensor-list facts included) and, for GGUF,
// the open file; no weights.
std::unique_ptr<LoadedModel> open_model_config(const std::string& path);

// `--load-format dummy`: the config (and tokenizer) of `path`, with random weights of the
// model's shape allocated through `backend` (matrices in its activation dtype, norms 1 +- 0.1,
// matrices uniform in +-`scale`), as vLLM's dummy format offers: benchmarks need no download.
// With tp.size > 1, only rank tp.rank's shapes (as load_model shards them) are allocated; the
// replicated norms are the same on every rank, the sharded tensors are drawn from seeds mixed
// with the rank (they are not slices of what a one-rank dummy load would draw).
class Backend;
// With pp.stages > 1, only the stage's layers are allocated (the others stay empty; each layer
// draws the values it would draw in a one-stage load).
// lazy_layers: the layers are made as the model places them (LoadedModel::make_layer), the same
// values, so a backend that copies or quantizes them at placement (stacked q|k|v, FP8) never
// holds every layer twice: a 70B quantized to FP8 fits where its bf16 layers would not.
std::unique_ptr<LoadedModel> load_dummy_model(const std::string& path, Backend& backend, uint64_t seed = 0,
                                              float scale = 0.02f, TensorParallel tp = {}, PipelineStage pp = {},
                                              bool lazy_layers = false);

// The embedded default model's folder: $PEREGRINE_MODELS or models/ next to the source tree,
// or next to the binary.
std::string default_model_path();

}  // namespace peregrine
