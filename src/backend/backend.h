// The contract the model's forward pass is written against: a device (device.h) plus the
// blocks of a decoder step. Blocks are coarse (one call per layer stage) so that each backend
// chooses its own kernels, fusion, weight layout and scratch buffers inside them: the CPU runs
// each block as plain ops (unfused_blocks.h), CUDA folds norms, projections and residual adds
// into fewer kernels. The residual stream and logits are f32 [rows, cols]; weights may be any
// dtype the backend reports in `supports_weight_dtype`.
#pragma once

#include <cstdint>

#include "backend/batch.h"
#include "backend/device.h"
#include "backend/rope_table.h"
#include "backend/weights.h"
#include "core/tensor.h"
#include "dist/communicator.h"

namespace peregrine {

// One layer's attention, besides its weights and its cache.
struct AttentionParams {
    int num_heads = 0;
    int num_kv_heads = 0;  // GQA: query head h reads kv head h / (num_heads / num_kv_heads)
    int head_dim = 0;
    float norm_eps = 0.0f;            // of the pre-norm and of the qk-norm
    float scale = 1.0f;               // of q·k before the softmax
    int window = 0;                   // > 0: a query at position p sees keys in (p - window, p]
    const RopeTable* rope = nullptr;  // must outlive the backend (CUDA keeps a device copy)
    // Tensor parallelism: this rank holds num_heads of the model's query heads (and their kv
    // heads), so its o-projection is a partial sum, all-reduced over `tp` before the residual
    // add. Null (or a group of 1): the whole layer is here.
    Communicator* tp = nullptr;
};

class Backend : public DeviceServices {
  public:
    // Whether the blocks read weights of this dtype directly (others are converted at load).
    virtual bool supports_weight_dtype(DType t) const = 0;

    // Element type of the buffers between kernels (projection inputs and outputs, q/k/v,
    // attention output). The residual stream, norm weights and logits are always f32.
    virtual DType activation_dtype() const { return DType::F32; }
    // Element type of the KV caches made from now on (model/kv_cache.h): the backend's native one
    // (f32 on the CPU, bf16 on CUDA), or F8_E4M3 codes with per-(token, kv head) scales
    // (core/kv_fp8.h) once set_kv_cache_dtype chose it. Every attention op reads either.
    virtual DType native_kv_cache_dtype() const { return DType::F32; }
    DType kv_cache_dtype() const { return kv_fp8_ ? DType::F8_E4M3 : native_kv_cache_dtype(); }
    // t: native_kv_cache_dtype() or F8_E4M3; Error for any other. Set before the caches are made.
    void set_kv_cache_dtype(DType t);

    // Places one layer's loaded weights (host tensors, or this device's for dummy weights) and
    // returns the layer as this backend's blocks read it. The base places each tensor apart
    // with place_weight; a backend may instead stack q/k/v into wqkv (+ bqkv) and gate/up into
    // w_gate_up (weights.h). q_norm/k_norm are set exactly when the model uses qk-norm.
    virtual LayerWeights place_layer(const LayerWeights& host);
    // Places an untied LM head (only ever multiplied, never gathered like the embedding): by
    // default as place_weight does; a backend may keep it in a product-only layout.
    virtual Tensor place_lm_head(const Tensor& host) { return place_weight(host, true); }
    // The LM head of a model whose head is its embedding, from the placed embedding: that tensor
    // itself, or a copy in another layout (the CUDA backend's FP8 head).
    virtual Tensor place_tied_head(const Tensor& placed_embedding) { return placed_embedding; }
    // Places the token embedding (gathered by embedding(); with tied_head also the LM head's
    // product weight): by default as place_weight's matrices.
    virtual Tensor place_embedding(const Tensor& host, bool tied_head) {
        (void)tied_head;
        return place_weight(host, true);
    }

    // The blocks of one step, called between begin_step(batch) and the step's end with the
    // same `batch` (n = batch.num_tokens()). Caches: [num_blocks, block_size, num_kv_heads,
    // head_dim] of kv_cache_dtype(), or for F8_E4M3 the byte layout of core/kv_fp8.h.

    // out[i] = table[ids[i] - vocab_begin] (any weight dtype, converted to f32); rows whose id
    // lies outside [vocab_begin, vocab_begin + table.rows()) are zeros: under vocabulary-parallel
    // tensor parallelism another rank holds them (and an all-reduce fills them in). out: [n, hidden] f32.
    virtual void embedding(const Tensor& table, const int32_t* ids, int64_t n, const Tensor& out,
                           int32_t vocab_begin) = 0;

    // One layer's attention, adding into the residual stream residual [n, hidden] f32:
    //   h = rms_norm(residual) * attn_norm
    //   q, k, v = h · wqᵀ + bq, h · wkᵀ + bk, h · wvᵀ + bv  (biases where set)
    //   q, k = rms_norm per head * q_norm, k_norm  (where q_norm is set: qwen3)
    //   q, k rotated at batch.positions; k, v written to the cache slots of batch.slot_mapping
    //   residual += attention(q over the sequence's cached keys and values) · woᵀ
    // The attention is causal per sequence, limited to `window` where set.
    virtual void attention_block(const Tensor& residual, const LayerWeights& w, const AttentionParams& p,
                                 const BatchInput& batch, const Tensor& k_cache, const Tensor& v_cache) = 0;

    // One layer's MLP, adding into residual [n, hidden] f32:
    //   h = rms_norm(residual) * ffn_norm
    //   residual += (silu(h · w_gateᵀ) * (h · w_upᵀ)) · w_downᵀ
    // With `tp` (a group of several ranks) this rank holds a slice of the intermediate size and
    // the down product is all-reduced over `tp` before the add, as in attention_block.
    virtual void mlp_block(const Tensor& residual, const LayerWeights& w, float norm_eps, Communicator* tp) = 0;

    // The final norm and LM head for the rows whose logits the step returns:
    //   out[i] = (rms_norm(residual[batch.logits_indices[i]]) * final_norm) · lm_headᵀ
    // out: [logits_indices.size() >= 1, vocab] f32. The LM head keeps full-precision inputs even
    // in a reduced-precision mode: its near-ties decide greedy tokens, and it runs for few rows.
    virtual void logits(const Tensor& residual, const Tensor& final_norm, float norm_eps, const Tensor& lm_head,
                        const BatchInput& batch, const Tensor& out) = 0;

  private:
    bool kv_fp8_ = false;
};

}  // namespace peregrine
