// What a backend's device offers apart from the forward pass's ops: memory (allocate, copy in
// and out, place weights, copy KV blocks), waiting and memory figures, and the recording of
// steps (CUDA graphs). The engine sizes memory and records steps through this; the model's
// forward pass runs the blocks of backend.h. Tensors here are this device's unless noted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/batch.h"
#include "backend/device_sampler.h"
#include "core/tensor.h"

namespace peregrine {

// A uniform value in [lo, hi] that depends only on (seed, index): dummy weights.
float uniform_hash(uint64_t seed, uint64_t index, float lo, float hi);

class DeviceServices {
  public:
    virtual ~DeviceServices() = default;

    virtual Device device() const = 0;
    virtual std::string name() const = 0;  // e.g. "cpu (avx512, 2 threads)"

    // ---- memory ---------------------------------------------------------------------------------

    // Device memory, owned by the caller until `release`.
    virtual Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) = 0;
    virtual void release(Tensor& t) = 0;
    // Copies between host memory and a tensor of this device (a plain memcpy on the CPU).
    virtual void upload(const void* src, const Tensor& dst) = 0;
    virtual void download(const Tensor& src, void* dst) = 0;

    // Places a loaded weight (host memory: a file mapping or a converted buffer) where this
    // device's ops read it; the device owns what it allocates here until it is destroyed.
    // `matrix`: a matmul or embedding weight (else a norm weight or bias, kept f32).
    virtual Tensor place_weight(const Tensor& host, bool matrix) {
        (void)matrix;
        return host;
    }
    // Fills `t` with uniform values in [lo, hi], deterministic in `seed` (uniform_hash of the
    // element index): the weights of `--load-format dummy`. The base reads host tensors only.
    virtual void fill_random(const Tensor& t, uint64_t seed, float lo, float hi);

    // Copies whole KV blocks (copy-on-write): cache[dst] = cache[src] for each pair.
    // cache: [num_blocks, block_size, num_kv_heads, head_dim].
    virtual void copy_blocks(const Tensor& cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) = 0;

    // ---- the host tier of the KV cache (--kv-offload-memory) -----------------------------------

    // Host memory that the device copies to and from asynchronously (page-locked on CUDA:
    // cudaHostAlloc), `bytes` long, owned by the caller until free_host. Throws Error when the
    // memory cannot be had.
    virtual void* allocate_host(size_t bytes);
    virtual void free_host(void* p);
    // Whole KV blocks between this device's block pools and host slots. `caches`: every tensor
    // of the pool, each [num_blocks, ...] (every layer's K then V); host slot s, at
    // host + s * slot_bytes, holds a block's rows of each cache in that order (slot_bytes = the
    // sum of one block's bytes over the caches). Ordered after every op queued before and
    // before every op queued after on this device (the base: plain memcpy, host tensors).
    // to_host: pairs (block, slot); from_host: pairs (slot, block).
    virtual void copy_blocks_to_host(const std::vector<Tensor>& caches,
                                     const std::vector<std::pair<int32_t, int32_t>>& pairs, void* host,
                                     size_t slot_bytes);
    virtual void copy_blocks_from_host(const void* host, size_t slot_bytes,
                                       const std::vector<std::pair<int32_t, int32_t>>& pairs,
                                       const std::vector<Tensor>& caches);

    // dst[r, dst_col + c] = src[r, src_col + c] for r < rows, c < cols: 2-D tensors of this
    // device of one dtype, each row `cols()` elements apart (the tensor-parallel logits gather).
    virtual void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t rows,
                              int64_t cols) = 0;
    // The queue (CUDA stream) this device's ops run on, for collectives that must join it
    // (NCCL); null where ops run in the caller's thread.
    virtual void* native_stream() { return nullptr; }
    // The GPU this device drives (-1: none).
    virtual int device_index() const { return -1; }
    // Makes this device the calling thread's own (CUDA's current device is per thread: a step
    // run on a thread other than the one that built the backend would otherwise create its
    // events and buffers on GPU 0). Cheap when already so.
    virtual void make_current() {}

    // Waits until every queued operation is done (nothing to wait for where ops run in the
    // caller's thread, as on the CPU).
    virtual void synchronize() {}
    // Device memory free and total, bytes; false where the device has no memory of its own to
    // budget (the CPU: its tensors live in host memory).
    virtual bool memory_info(size_t& free_bytes, size_t& total_bytes) const {
        free_bytes = total_bytes = 0;
        return false;
    }

    // Bytes of weights placed in this device's own memory (0 where weights stay in host memory).
    virtual size_t weight_bytes() const { return 0; }
    // A sampler that draws where this device's logits lie, for up to `max_rows` draws a step
    // over `vocab` logits; null where the host samples (the CPU).
    virtual std::unique_ptr<DeviceSampler> make_sampler(int max_rows, int vocab) {
        (void)max_rows;
        (void)vocab;
        return nullptr;
    }

    // ---- steps ----------------------------------------------------------------------------------

    // Called once before a step's ops with the step's batch, which stays alive and unchanged
    // until the step's logits are downloaded. A backend sizes its blocks' scratch here (for
    // batch.num_tokens() tokens and logits_indices.size() logits rows); a GPU backend also
    // uploads the batch's metadata.
    virtual void begin_step(const BatchInput& batch) { (void)batch; }
    // The batch size a decode-only batch of `num_seqs` sequences is padded to so that a
    // recorded step can be replayed (CUDA graphs), or -1 when this device records nothing.
    virtual int step_bucket(int num_seqs) const {
        (void)num_seqs;
        return -1;
    }
    // Runs `ops`, the ops of one step from the embedding to the logits. With key >= 0 a
    // device may record them on first use and replay the recording for later steps of the
    // same key instead of calling `ops`; the ops must then read only device memory that
    // begin_step refreshes, at addresses that stay put until forget_steps.
    virtual void run_step(int key, const std::function<void()>& ops) {
        (void)key;
        ops();
    }
    // Drops every recording made by run_step: the buffers they read or write (workspace, KV
    // cache) are about to move.
    virtual void forget_steps() {}
    // The warm-up before the first request has ended (Worker::warm_up): work a device may do
    // once per new shape to pick its fastest form (timing candidates, which waits for the
    // device) is worth it only there, not inside a request's time to first token.
    virtual void end_warm_up() {}
};

}  // namespace peregrine
