// The executor contract between the engine core and the devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/batch.h"
#include "backend/device_sampler.h"

namespace peregrine {

struct TokenLogprob;

// What the engine core needs from the model's side: run a flattened batch against the KV
// cache and, where the device samples, draw there. LocalExecutor (local_executor.h) runs it
// on its workers; tests use a fake with the same contract.
class ModelExecutor {
  public:
    virtual ~ModelExecutor() = default;
    virtual int vocab_size() const = 0;
    virtual int max_model_len() const = 0;
    virtual int num_kv_blocks() const = 0;
    virtual int block_size() const = 0;
    // Copy-on-write of KV blocks, before the batch that writes them.
    virtual void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) = 0;
    // The host tier of the KV cache (EngineConfig::kv_offload_memory): its size in blocks (0:
    // none) and the bytes of one block, every layer's K and V.
    virtual int num_host_kv_blocks() const { return 0; }
    virtual size_t kv_block_bytes() const { return 0; }
    // The KV cache's element type, as dtype_name spells it ("": not known).
    virtual std::string kv_cache_dtype() const { return {}; }
    // Copies whole blocks between the device pool and the host tier, after every op queued
    // before and before every op queued after (the next step waits for them): pairs
    // (device block, host slot) out, (host slot, device block) in. One call per step each way.
    virtual void offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs);
    virtual void onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs);
    // The host tier's bytes, slot s at host_kv_data() + s * kv_block_bytes() (null: none), which
    // the disk tier's I/O thread reads and writes; wait_host_kv first returns once every copy
    // queued into them is done (a no-op where copies are plain memcpys, as on the CPU).
    virtual void* host_kv_data() { return nullptr; }
    virtual void wait_host_kv() {}
    // logits: [batch.logits_indices.size(), vocab].
    virtual void execute(const BatchInput& batch, std::vector<float>& logits) = 0;
    // Whether execute_on_device / launch_sampling / collect_samples are available.
    virtual bool samples_on_device() const { return false; }
    // Queues the batch and keeps its logits where they are computed, for launch_sampling. Token
    // ids -1 - i stand for draw i of the last launch_sampling (see max_fed_draws).
    virtual void execute_on_device(const BatchInput& batch);
    // Queues draws from the last execute_on_device's logits; collect_samples waits for them.
    virtual void launch_sampling(const std::vector<SampleRow>& rows);
    virtual void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs);
    // DeviceSampler::max_fed_draws: 0 when the next batch cannot take draws before they return.
    virtual int max_fed_draws() const { return 0; }
    // Embeddings, right after execute / execute_on_device of a batch with pool_ranges (before
    // anything else is queued): Model::pool's sums, [pool_ranges.size() / 2, hidden] f32.
    virtual void pool(const BatchInput& batch, std::vector<float>& out);
};

}  // namespace peregrine
