// The forward pass of the llama family (llama, mistral, qwen2, qwen3), written once against
// the Backend's blocks (embedding, per layer attention and MLP, logits).
#pragma once

#include <vector>

#include "backend/backend.h"
#include "backend/batch.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/model.h"
#include "model/rope.h"

namespace peregrine {

class LlamaModel final : public Model {
  public:
    // `model` must outlive this object. Each layer goes through Backend::place_layer and the
    // rest through place_weight: the CPU backend reads weights where they lie, a GPU backend
    // keeps device copies in the layout its blocks read.
    // `par` (its groups outlive this): par.tp is the tensor-parallel group `model` was sharded
    // for (model.config.tp): the blocks all-reduce their o / down products over it, the
    // embedding and LM head are vocabulary-parallel. par.pp: this rank runs its stage's layers
    // (stage_layers), receiving the residual stream from the stage before and sending it on.
    LlamaModel(const LoadedModel& model, Backend& backend, const ModelParallel& par = {});
    ~LlamaModel();
    LlamaModel(const LlamaModel&) = delete;
    LlamaModel& operator=(const LlamaModel&) = delete;

    const ModelConfig& config() const override { return config_; }
    KvCacheShape kv_cache_shape(int num_blocks, int block_size) const override;

    // Runs every token of `batch`, writing its keys and values into `cache`, and returns the
    // logits of the rows in `batch.logits_indices`: [logits_indices.size(), vocab] f32.
    void forward(const BatchInput& batch, KvCache& cache, std::vector<float>& logits) override;
    // The same, leaving the logits in the backend's memory: a view [logits_indices.size(), vocab]
    // valid until the next step (empty when no row is wanted).
    Tensor forward_device(const BatchInput& batch, KvCache& cache) override;
    // Reads the residual stream the step left (llama_pool.cc).
    void pool(const BatchInput& batch, std::vector<float>& out) override;

  private:
    // The model's own buffers, grown to the largest batch seen (no allocation in steady state);
    // the blocks' scratch belongs to the backend (backend/scratch.h).
    struct Workspace {
        int64_t capacity = 0;  // tokens
        int64_t logit_rows = 0;
        Tensor residual;     // [capacity, hidden] f32: the residual stream
        Tensor logits;       // [logit_rows, vocab] f32
        Tensor local;        // tensor parallelism: [logit_rows, this rank's vocabulary rows] f32
        Tensor gather_send;  // tensor parallelism: [logit_rows, widest slice] f32
        Tensor gather_recv;  // tensor parallelism: [T * logit_rows, widest slice] f32
    };
    // Tensor parallelism: the vocabulary-parallel embedding (this rank's rows, zeros for the
    // others' tokens, all-reduced) and the LM head's slices gathered into `out` [rows, vocab].
    void embed_sharded(const BatchInput& batch, const Tensor& residual);
    void gather_logits(const Tensor& local, const Tensor& out);
    bool sharded() const { return tp_ != nullptr && tp_->size() > 1; }
    bool first_stage() const { return pp_ == nullptr || pp_->rank() == 0; }
    bool last_stage() const { return pp_ == nullptr || pp_->rank() == pp_->size() - 1; }
    bool staged() const { return pp_ != nullptr && pp_->size() > 1; }
    int tp_rank() const { return tp_ ? tp_->rank() : 0; }
    // Whose forward returns the logits: every rank of a single stage; with pipeline stages, the
    // first stage's tensor-parallel rank 0 only (the rank that samples), to which the last
    // stage's rank 0 sends them over the pipeline communicator (device to device on CUDA).
    bool holds_logits() const { return !staged() || (first_stage() && tp_rank() == 0); }
    void reserve(int64_t tokens, int64_t logit_rows);
    void free_workspace();
    // The blocks of one step, from the embedding to logits in ws_.logits; returns the logits view.
    Tensor run_ops(const BatchInput& batch, KvCache& cache);
    // A decode-only batch padded with empty sequences to `bucket` sequences.
    void pad_decode_batch(const BatchInput& batch, int bucket, BatchInput& padded) const;
    BatchInput padded_;
    std::vector<const void*> recorded_cache_, cache_ptrs_;  // per layer K and V of the cache step recordings write

    ModelConfig config_;
    ModelWeights weights_;  // as placed by the backend
    Backend& backend_;
    Communicator* tp_;
    Communicator* pp_;
    int first_layer_ = 0, num_stage_layers_ = 0;  // this stage's layers: [first, first + num)
    RopeTable rope_;
    Workspace ws_;
    std::vector<float> final_norm_host_;  // [hidden]: the final norm's weight, read back once for pool()
    std::vector<float> pool_rows_;        // [rows, hidden]: pool()'s download of residual rows
};

}  // namespace peregrine
