// The device side of one rank: its backend, the model's weights placed there, the paged KV
// cache and, where the backend has one, a sampler that draws where the logits lie. A worker is
// built in steps so that an executor with several ranks can size every rank's cache alike:
//
//   Worker w(config);
//   w.init_device();                          // the backend
//   w.load_model();                           // weights, placed by the backend
//   w.init_kv_cache(w.determine_kv_blocks());  // profiles memory (CUDA) and allocates the pool
//   w.init_host_kv_cache(config.kv_offload_memory);  // the host tier (none for 0)
//   w.warm_up();                              // records the decode steps' graphs (CUDA)
//
// Then `execute*` run flattened batches. One thread drives a worker (the engine's).
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "backend/batch.h"
#include "backend/device_sampler.h"
#include "model/loader.h"
#include "model/model.h"
#include "peregrine/engine_config.h"

namespace peregrine {

class Backend;
class KvCache;
struct TokenLogprob;

// Whether a worker of `config` runs on the CUDA backend (device cuda, or auto with a GPU present).
bool worker_uses_cuda(const EngineConfig& config);
// GPUs this process can use (0 in a build without CUDA).
int worker_gpu_count();

// Where a worker sits in a model-parallel group (worker/rank_group.h). The default: alone.
struct WorkerPlace {
    // The tensor / pipeline communicators over this worker's backend (null where that size is
    // 1), made once the backend exists (NCCL joins its stream). Empty: alone.
    std::function<ModelParallel(Backend&)> connect;
    TensorParallel tp;     // the weight slices it loads
    PipelineStage pp;      // the layers it loads
    int device_index = 0;  // CUDA device
    bool verbose = true;   // prints the load summary (rank 0 of a group)
};

// The longest sequence (tokens) an engine serves: `requested` (EngineConfig::max_model_len) when
// it fits the model's context and the KV cache's `kv_tokens`, else Error naming the numbers and
// the flags to change; 0 asks for the model's context, lowered to kv_tokens (warning on stderr
// when `verbose`). bytes_per_token: one token's K and V, every layer.
int settle_max_model_len(int requested, int model_len, int64_t kv_tokens, size_t bytes_per_token, bool verbose);

class Worker {
  public:
    explicit Worker(const EngineConfig& config, const WorkerPlace& place = {});
    // A worker over a backend and a model that the caller built and keeps alive (tests,
    // benchmarks): device and model steps are done; the KV cache is allocated here.
    // `sampler` (may be null) draws from logits left on the device.
    Worker(Backend& backend, Model& model, int num_blocks, int block_size, DeviceSampler* sampler = nullptr);
    ~Worker();
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;

    void init_device();
    void load_model();
    // KV blocks that fit: on CUDA what the utilisation target leaves after a profiling step of
    // the largest batch; else config.kv_cache_memory, or max_num_seqs full contexts (<= 4 GiB).
    int determine_kv_blocks();
    // Allocates the pool; a worker built from an EngineConfig then settles max_model_len()
    // (EngineConfig::max_model_len against the model's context and the pool; throws when an
    // explicit length does not fit).
    void init_kv_cache(int num_blocks);
    // The host tier of the KV cache: as many whole blocks as `bytes` holds, in host memory
    // from the backend (pinned on CUDA). 0: none. Throws Error when bytes is negative or less
    // than one block.
    void init_host_kv_cache(int64_t bytes);
    // The host-tier blocks `bytes` hold at this worker's block size (its slice of the cache in a
    // group), and the tier made of exactly `blocks` of them (a group agrees on the fewest).
    int host_kv_blocks_for(int64_t bytes) const;
    void init_host_kv_blocks(int blocks);
    void warm_up();

    const ModelConfig& model_config() const { return model_->config(); }
    // The configuration this worker runs, device defaults applied (after init_device).
    const EngineConfig& config() const { return config_; }
    // Tokens of one sequence at most: the model's context, or less (init_kv_cache).
    int max_model_len() const { return max_model_len_ > 0 ? max_model_len_ : model_->config().max_position_embeddings; }
    const LoadedModel& loaded() const;  // after load_model (not for a borrowed model)
    Backend& backend() { return *backend_; }
    int num_kv_blocks() const;
    int block_size() const;
    int num_host_kv_blocks() const { return host_blocks_; }
    size_t kv_block_bytes() const;  // one block of every layer's K and V
    DType kv_cache_dtype() const;   // the pool's element type (after init_kv_cache)
    void* host_kv_data() { return host_kv_; }
    // Every device <-> host-tier copy queued so far is done (the whole device, conservatively).
    void wait_host_kv();

    // Copy-on-write of KV blocks, before the batch that writes them.
    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs);
    // Host-tier copies, one backend call each way: (device block, host slot) / (host slot, device block).
    void offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs);
    void onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs);
    // logits: [batch.logits_indices.size(), vocab] f32 on the host.
    void execute(const BatchInput& batch, std::vector<float>& logits);
    // Device sampling (samples_on_device()): the logits stay on the device for launch_sampling.
    bool samples_on_device() const { return sampler_ != nullptr; }
    void execute_on_device(const BatchInput& batch);
    void launch_sampling(const std::vector<SampleRow>& rows);
    void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs);
    int max_fed_draws() const;
    // Model::pool of the batch just executed.
    void pool(const BatchInput& batch, std::vector<float>& out);

  private:
    EngineConfig config_;
    WorkerPlace place_;
    std::unique_ptr<Backend> own_backend_;
    std::unique_ptr<LoadedModel> loaded_;
    std::unique_ptr<Model> own_model_;
    std::unique_ptr<DeviceSampler> own_sampler_;
    Backend* backend_ = nullptr;
    Model* model_ = nullptr;
    DeviceSampler* sampler_ = nullptr;
    std::unique_ptr<KvCache> cache_;
    std::vector<Tensor> cache_tensors_;  // every layer's K then V: the order of a host slot
    void* host_kv_ = nullptr;            // [host_blocks_, kv_block_bytes()] (backend's allocate_host)
    int host_blocks_ = 0;
    std::unique_ptr<Tensor> device_logits_;  // the last execute_on_device's logits
    size_t free_at_init_ = 0;                // device memory free once the backend existed (0: none)
    int max_model_len_ = 0;                  // 0: the model's context
};

}  // namespace peregrine
