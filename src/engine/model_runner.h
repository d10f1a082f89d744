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
struct Tensor;
struct TokenLogprob;

// One token to draw from row `row` of a step's logits for `seq` (several choices of one
// request may share a row right after their common prompt).
struct SampleSpec {
    int row = 0;
    Sequence* seq = nullptr;
    bool logprobs = false;
};

// Sampling where the logits are (a GPU): only token ids and requested logprobs come back.
// Handles penalties, temperature, top-k/p, min-p and seeds; not logit_bias or min_tokens
// masking, for which the engine downloads the logits and samples on the CPU.
// One draw set at a time: launch, then collect, then the next launch.
class DeviceSampler {
  public:
    virtual ~DeviceSampler() = default;
    // Queues the draws. logits: [rows, vocab] f32 on the device. The specs' sequences are read
    // here only (parameters, seeds, penalty histories), not by collect.
    virtual void launch(const Tensor& logits, const std::vector<SampleSpec>& specs) = 0;
    // Waits for the last launch's draws: one token per spec, logprobs filled for specs that ask.
    virtual void collect(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) = 0;
    // Up to how many draws of the last launch the next step can take as input tokens on the
    // device (BatchInput token id -1 - i = draw i) without them coming back first; 0 = none.
    virtual int max_fed_draws() const { return 0; }
};

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
    // Whether execute_on_device / launch_sampling / collect_samples are available.
    virtual bool samples_on_device() const { return false; }
    // Queues the batch and keeps its logits where they are computed, for launch_sampling. Token
    // ids -1 - i stand for draw i of the last launch_sampling (see max_fed_draws).
    virtual void execute_on_device(const BatchInput& batch);
    // Queues draws from the last execute_on_device's logits; collect_samples waits for them.
    virtual void launch_sampling(const std::vector<SampleSpec>& specs);
    virtual void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs);
    // DeviceSampler::max_fed_draws: 0 when the next batch cannot take draws before they return.
    virtual int max_fed_draws() const { return 0; }
};

// The model and its paged KV cache on one backend.
class LlamaExecutor final : public ModelExecutor {
  public:
    // `sampler` (may be null, else must outlive this) samples from logits left on the device.
    LlamaExecutor(LlamaModel& model, Backend& backend, int num_blocks, int block_size,
                  DeviceSampler* sampler = nullptr);
    ~LlamaExecutor() override;

    int vocab_size() const override;
    int max_model_len() const override;
    int num_kv_blocks() const override;
    int block_size() const override;
    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void execute(const BatchInput& batch, std::vector<float>& logits) override;
    bool samples_on_device() const override { return sampler_ != nullptr; }
    void execute_on_device(const BatchInput& batch) override;
    void launch_sampling(const std::vector<SampleSpec>& specs) override;
    void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) override;
    int max_fed_draws() const override { return sampler_ ? sampler_->max_fed_draws() : 0; }

  private:
    LlamaModel& model_;
    Backend& backend_;
    std::unique_ptr<KvCache> cache_;
    DeviceSampler* sampler_;
    std::unique_ptr<Tensor> device_logits_;  // the last execute_on_device's logits
};

// Flattens the scheduler's choice: tokens [num_computed, num_computed + num_new) of each
// scheduled sequence, with logits for those that sample (in the order of out.seqs).
void build_batch(const SchedulerOutput& out, int block_size, BatchInput& batch);

}  // namespace peregrine
