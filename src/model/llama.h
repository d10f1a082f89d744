// The forward pass of the llama family (llama, mistral, qwen2, qwen3), written once against
// the Backend interface.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/batch.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/rope.h"

namespace peregrine {

class LlamaModel {
  public:
    // `model` must outlive this object. Each weight goes through Backend::place_weight: the
    // CPU backend reads it where it lies, a GPU backend keeps a device copy.
    LlamaModel(const LoadedModel& model, Backend& backend);
    ~LlamaModel();
    LlamaModel(const LlamaModel&) = delete;
    LlamaModel& operator=(const LlamaModel&) = delete;

    const ModelConfig& config() const { return config_; }
    KvCacheShape kv_cache_shape(int num_blocks, int block_size) const;

    // Runs every token of `batch`, writing its keys and values into `cache`, and returns the
    // logits of the rows in `batch.logits_indices`: [logits_indices.size(), vocab] f32.
    void forward(const BatchInput& batch, KvCache& cache, std::vector<float>& logits);
    // The same, leaving the logits in the backend's memory: a view [logits_indices.size(), vocab]
    // valid until the next step (empty when no row is wanted).
    Tensor forward_device(const BatchInput& batch, KvCache& cache);

  private:
    // Activation buffers, grown to the largest batch seen (no allocation in steady state).
    struct Workspace {
        int64_t capacity = 0;  // tokens
        int64_t logit_rows = 0;
        Tensor residual, hidden, normed;  // [capacity, hidden]
        Tensor q, attn;                   // [capacity, q_dim]
        Tensor k, v;                      // [capacity, kv_dim]
        Tensor gate, up;                  // [capacity, intermediate]
        Tensor selected;                  // [logit_rows, hidden]
        Tensor logits;                    // [logit_rows, vocab]
    };
    void reserve(int64_t tokens, int64_t logit_rows);
    void free_workspace();
    // The ops of one step, from the embedding to logits in ws_.logits; returns the logits view.
    Tensor run_ops(const BatchInput& batch, KvCache& cache);
    // A decode-only batch padded with empty sequences to `bucket` sequences.
    void pad_decode_batch(const BatchInput& batch, int bucket, BatchInput& padded) const;
    BatchInput padded_;
    std::vector<const void*> recorded_cache_, cache_ptrs_;  // per layer K and V of the cache step recordings write

    ModelConfig config_;
    ModelWeights weights_;  // as placed by the backend
    Backend& backend_;
    RopeTable rope_;
    Workspace ws_;
};

}  // namespace peregrine
