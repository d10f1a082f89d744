// FP8 checkpoints as published on Hugging Face: layer matrices stored as F8_E4M3 `...weight`
// tensors whose factors are separate tensors named after them, the layout declared by
// config.json's quantization_config. Two declarations are read:
//   - quant_method "fp8" (vLLM / transformers): without weight_block_size, `weight_scale` holds
//     one factor per tensor (vLLM's fp8 format); with weight_block_size [br, bc] (transformers'
//     FineGrainedFP8, DeepSeek-V3 style), `weight_scale_inv` holds one factor per block of
//     br x bc elements, [ceil(rows / br), ceil(cols / bc)]. Despite the name, both multiply:
//     element = value * factor.
//   - quant_method "compressed-tensors", format "float-quantized" (llm-compressor; or
//     "naive-quantized", which stores FP8 the same way): every
//     config group's weights are num_bits 8, type float, strategy tensor (`weight_scale` [1]),
//     channel ([rows, 1]) or block (block_structure [br, bc]).
// Static `input_scale` tensors (activation_scheme "static", input_activations not dynamic) are
// read by nobody: the CUDA backend quantizes activations per token at run time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace peregrine {

struct Fp8Format {
    std::string description;  // e.g. "compressed-tensors float-quantized, strategy channel"
    // The factors of weight W are tensor W + scale_suffix ("...weight_scale").
    std::string scale_suffix;
    bool per_tensor = false;   // factor tensors of one element ([] or [1]) accepted
    bool per_channel = false;  // [rows, 1] (or [rows]) accepted
    // > 0: block-wise factors [ceil(rows / block_rows), ceil(cols / block_cols)].
    int64_t block_rows = 0, block_cols = 0;
    bool static_input_scales = false;  // the file carries input_scale tensors (ignored)
    bool kv_cache_scales = false;      // compressed-tensors kv_cache_scheme: k_scale / v_scale (ignored)
};

// The FP8 layout config.json (in `dir`) declares; nullopt without a quantization_config.
// Throws Error naming config.json and the key for a quantization this loader cannot read.
std::optional<Fp8Format> read_fp8_format(const std::string& dir);

// What the load log says about the format, e.g. "fp8 checkpoint (...); input_scale ignored: ...".
std::string fp8_load_note(const Fp8Format& f);

// The host tensor for f8_e4m3 weight `name` (`w`, [rows, cols]) whose factor tensor is `scale`
// (empty when the file has none; `where` names the model in errors):
//   - per-tensor or per-channel factors: `w` itself with Tensor::scale at f32 [rows] factors
//     (a per-tensor factor repeated), appended to `factors`;
//   - block-wise factors: the same when every row block has one factor across its columns
//     (exact), else `w` dequantized to bf16 [rows, cols], appended to `bf16_bytes`.
// Throws Error naming the tensor for a missing factor tensor or one of the wrong shape or dtype.
Tensor resolve_fp8_weight(const Fp8Format& f, const std::string& where, const std::string& name, const Tensor& w,
                          const Tensor& scale, std::vector<std::vector<float>>& factors,
                          std::vector<std::vector<uint8_t>>& bf16_bytes);

// A host f8_e4m3 matrix with its row factors as bf16 (appended to `bf16_bytes`): for tensors
// the blocks read only as bf16 or f32 (the embedding, the LM head).
Tensor fp8_to_bf16(const Tensor& w, std::vector<std::vector<uint8_t>>& bf16_bytes);

}  // namespace peregrine
