// Turns a scheduled step into one flattened batch and runs the model on it.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "model/batch.h"

namespace peregrine {

class Backend;
class LlamaModel;
class KvCache;

// What the engine needs from a model: run a batch against its own KV cache. The real one
// wraps LlamaModel; tests use a fake with the same contract.
class ModelExecutor {
  public:
    virtual ~ModelExecutor() = default;
    virtual int vocab_size() const = 0;
    virtual int max_model_len() const = 0;
    virtual int num_kv_blocks() const = 0;
    virtual int block_size() const = 0;
    // Copy-on-write of KV blocks, before the batch that writes them.
    virtual void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) = 0;
    // logits: [batch.logits_indices.size(), vocab].
    virtual void execute(const BatchInput& batch, std::vector<float>& logits) = 0;
};

// The model and its paged KV cache on one backend.
class LlamaExecutor final : public ModelExecutor {
  public:
    LlamaExecutor(LlamaModel& model, Backend& backend, int num_blocks, int block_size);
    ~LlamaExecutor() override;

    int vocab_size() const override;
    int max_model_len() const override;
    int num_kv_blocks() const override;
    int block_size() const override;
    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void execute(const BatchInput& batch, std::vector<float>& logits) override;

  private:
    LlamaModel& model_;
    Backend& backend_;
    std::unique_ptr<KvCache> cache_;
};

// Flattens the scheduler's choice: tokens [num_computed, num_computed + num_new) of each
// scheduled sequence, with logits for those that sample (in the order of out.seqs).
void build_batch(const SchedulerOutput& out, int block_size, BatchInput& batch);

}  // namespace peregrine
