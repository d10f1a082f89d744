// The executor of a model-parallel group (worker/rank_group.h), on rank 0: each batch goes
// first to every other rank over the control channel, then runs on rank 0's own worker; every
// rank's forward meets the others' in the collectives (tensor parallel) or hands the residual
// stream on (pipeline parallel), and the last stage's logits come back to rank 0 over the
// pipeline communicator, inside the step (LlamaModel). Rank 0 samples: on the CPU, or on its
// GPU from the gathered logits.
//
// A rank that fails ends the whole group: rank 0 prints a line naming the rank ("peregrine:
// rank 1 (pid 4242 on host-a) killed by signal 9; stopping the group") and exits 1,
// whether the rank died in a step or while the group idled (RankGroup::watch).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "peregrine/engine_config.h"
#include "worker/executor.h"
#include "worker/rank_group.h"
#include "worker/worker.h"

namespace peregrine {

class ParallelExecutor final : public ModelExecutor {
  public:
    // On rank 0: loads its slices, agrees on the KV blocks with the other ranks, watches them.
    static std::unique_ptr<ParallelExecutor> create(std::unique_ptr<RankGroup> group);
    // Stops the group: every rank is told to stop, this host's ranks are waited for.
    ~ParallelExecutor() override;

    Worker& worker() { return *worker_; }
    RankGroup& group() { return *group_; }

    int vocab_size() const override;
    int max_model_len() const override;
    int num_kv_blocks() const override;
    int block_size() const override;
    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    // The host tier: every rank holds its slice of each slot; kv_block_bytes is a block's bytes
    // over all the slices (what a copy of one block moves in the group). The copies go to every
    // rank like a step. No disk tier (host_kv_data stays null: each slice would need its file).
    int num_host_kv_blocks() const override;
    size_t kv_block_bytes() const override;
    std::string kv_cache_dtype() const override;
    void offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void execute(const BatchInput& batch, std::vector<float>& logits) override;
    // Rank 0 samples where its logits lie (CUDA: the gathered logits on its GPU). Draws are not
    // fed into the next batch on the device (max_fed_draws 0): the other ranks embed the ids
    // rank 0 sends them, so each step's tokens come back before the next is sent.
    bool samples_on_device() const override;
    void execute_on_device(const BatchInput& batch) override;
    void launch_sampling(const std::vector<SampleRow>& rows) override;
    void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) override;
    // Rank 0 reads its own residual stream (tensor-parallel ranks each hold all of it); with
    // pipeline stages the last stage holds it, which is not rank 0: refused (EngineConfig::validate
    // refuses embeddings with pipeline_parallel_size > 1 before that).
    void pool(const BatchInput& batch, std::vector<float>& out) override;

  private:
    ParallelExecutor(std::unique_ptr<RankGroup> group, std::unique_ptr<Worker> worker, size_t block_bytes);
    void in_step(const std::string& message, const std::function<void()>& mine);
    std::unique_ptr<RankGroup> group_;
    std::unique_ptr<Worker> worker_;
    const size_t block_bytes_;  // a KV block over every rank's slice
};

// Joins the group `config` asks for (config.parallel_size() > 1) as early as the caller can, so
// that this host's ranks are forked before any thread starts. On rank 0 it keeps the group for
// create_executor and returns; on every other rank it serves the group (loads its slices, runs
// what rank 0 sends) and ends the process: 0 when rank 0 stopped the group, 1 on a failure.
void join_model_group(const EngineConfig& config);

// The executor `config` asks for: a LocalExecutor, or for a group a ParallelExecutor (joining
// the group first unless join_model_group did). `worker` is rank 0's worker: its model's facts.
struct BuiltExecutor {
    std::unique_ptr<ModelExecutor> executor;
    Worker* worker = nullptr;
};
BuiltExecutor create_executor(const EngineConfig& config);

}  // namespace peregrine
