// The executor the engine core talks to in one process: it owns the workers (one per rank of
// the model; one today, one per GPU once tensor/pipeline parallelism lands) and runs each
// scheduled batch on them.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "peregrine/engine_config.h"
#include "worker/executor.h"
#include "worker/worker.h"

namespace peregrine {

class LocalExecutor final : public ModelExecutor {
  public:
    explicit LocalExecutor(std::unique_ptr<Worker> worker);
    // Builds the workers of `config` and readies them: device, weights, KV cache, warm-up.
    static std::unique_ptr<LocalExecutor> create(const EngineConfig& config);
    // An executor over a backend and a model the caller owns (tests, benchmarks), with a host
    // KV tier of `host_kv_bytes` (0: none).
    static std::unique_ptr<LocalExecutor> over(Backend& backend, Model& model, int num_blocks, int block_size,
                                               DeviceSampler* sampler = nullptr, int64_t host_kv_bytes = 0);

    Worker& worker() { return *worker_; }
    const Worker& worker() const { return *worker_; }

    int vocab_size() const override;
    int max_model_len() const override;
    int num_kv_blocks() const override;
    int block_size() const override;
    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    int num_host_kv_blocks() const override;
    size_t kv_block_bytes() const override;
    std::string kv_cache_dtype() const override;
    void offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void* host_kv_data() override;
    void wait_host_kv() override;
    void execute(const BatchInput& batch, std::vector<float>& logits) override;
    bool samples_on_device() const override;
    void execute_on_device(const BatchInput& batch) override;
    void launch_sampling(const std::vector<SampleRow>& rows) override;
    void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) override;
    int max_fed_draws() const override;
    void pool(const BatchInput& batch, std::vector<float>& out) override;

  private:
    std::unique_ptr<Worker> worker_;
};

}  // namespace peregrine
