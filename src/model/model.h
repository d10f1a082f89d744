// What the engine's worker needs from a model's forward pass, whatever its architecture:
// run a flattened batch against a paged KV cache. Architectures are built by the registry
// (model/registry.h); the llama family's decoder (model/llama.h) is the one body today.
#pragma once

#include <vector>

#include "backend/batch.h"
#include "core/tensor.h"
#include "model/kv_cache.h"
#include "model/model_config.h"

namespace peregrine {

class Communicator;

// The groups a model's rank belongs to (each may be null: a group of one). `tp`: the ranks that
// split every layer (Megatron-style; the loaded config says which slice this is). `pp`: the
// pipeline stages, contiguous layer ranges in stage order; a stage receives the residual stream
// from the one before and sends it to the one after; the last computes the logits and sends
// them back to the first stage's tensor-parallel rank 0, the rank that samples.
struct ModelParallel {
    Communicator* tp = nullptr;
    Communicator* pp = nullptr;
};

class Model {
  public:
    virtual ~Model() = default;
    virtual const ModelConfig& config() const = 0;
    // The cache this model's layers read and write: [num_layers] K and V of
    // [num_blocks, block_size, num_kv_heads, head_dim].
    virtual KvCacheShape kv_cache_shape(int num_blocks, int block_size) const = 0;
    // Runs every token of `batch`, writing its keys and values into `cache`, and returns the
    // logits of the rows in `batch.logits_indices`: [logits_indices.size(), vocab] f32 (with
    // pipeline stages: only on the first stage's tensor-parallel rank 0, none elsewhere).
    virtual void forward(const BatchInput& batch, KvCache& cache, std::vector<float>& logits) = 0;
    // The same, leaving the logits in the backend's memory: a view [logits_indices.size(), vocab]
    // valid until the next step (empty when no row is wanted).
    virtual Tensor forward_device(const BatchInput& batch, KvCache& cache) = 0;
    // Embeddings, right after forward / forward_device of the same batch (before the next one):
    // out [batch.pool_ranges.size() / 2, hidden] f32 on the host, row i the sum over the token
    // rows [begin_i, end_i) of the final norm's output, rms_norm(hidden) * final_norm (zeros for an
    // empty range). The base refuses: a model that cannot pool.
    virtual void pool(const BatchInput& batch, std::vector<float>& out);
};

}  // namespace peregrine
