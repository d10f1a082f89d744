// The host tier of the KV cache (issue #21): pinned host blocks, and block copies between it and
// the GPU caches on a copy stream of their own, overlapped with the step.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/env.h"

namespace peregrine {

void* CudaBackend::allocate_host(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear it
        fail("cannot allocate ", bytes, " bytes of pinned host memory for the KV offload tier (", cudaGetErrorString(e),
             "): lower --kv-offload-memory");
    }
    return p;
}

void CudaBackend::free_host(void* p) {
    if (p) cudaFreeHost(p);
}

void CudaBackend::host_copies(bool to_host, const std::vector<Tensor>& caches,
                              const std::vector<std::pair<int32_t, int32_t>>& pairs, char* host, size_t slot_bytes) {
    if (pairs.empty()) return;
    PG_CHECK(!capturing(), "host-tier copies inside a recorded step");
    if (!copy_stream_) {
        PG_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
        PG_CUDA_CHECK(cudaEventCreateWithFlags(&copy_ready_, cudaEventDisableTiming));
        PG_CUDA_CHECK(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
    }
    // Offloads read blocks that queued steps wrote; onloads overwrite blocks that queued steps
    // may still read (their last users): both wait for the compute stream so far.
    PG_CUDA_CHECK(cudaEventRecord(copy_ready_, stream_));
    PG_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, copy_ready_, 0));
    std::vector<size_t> block_bytes;
    size_t total = 0;
    for (const Tensor& c : caches) {
        PG_CHECK(c.device == Device::CUDA);
        block_bytes.push_back(c.nbytes() / static_cast<size_t>(c.dim(0)));
        total += block_bytes.back();
    }
    PG_CHECK(total == slot_bytes, "host slot of ", slot_bytes, " bytes for blocks of ", total);
    // Kernels move the pieces through the pinned buffer's device alias; pieces that are not
    // 16-byte sized and aligned (none for the supported shapes) go by cudaMemcpyAsync. The list
    // is grouped by cache tensor (one kernel and event each when overlapped).
    char* alias = nullptr;
    PG_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&alias), host, 0));
    std::vector<cuda::HostCopy> list;
    list.reserve(pairs.size() * caches.size());
    std::vector<size_t> begin;  // by cache: its first piece in `list`
    size_t in_slot = 0;         // cache c's bytes start this far into a slot
    for (size_t c = 0; c < caches.size(); in_slot += block_bytes[c++]) {
        begin.push_back(list.size());
        for (const auto& [a, b] : pairs) {
            const int32_t block = to_host ? a : b, slot = to_host ? b : a;
            PG_CHECK(block >= 0 && block < caches[c].dim(0) && slot >= 0);
            const size_t offset = static_cast<size_t>(slot) * slot_bytes + in_slot;
            char* d = static_cast<char*>(caches[c].data) + static_cast<size_t>(block) * block_bytes[c];
            char* h = alias + offset;
            const bool vec = block_bytes[c] % 16 == 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0 &&
                             reinterpret_cast<uintptr_t>(h) % 16 == 0 && block_bytes[c] <= UINT32_MAX;
            if (vec)
                list.push_back(
                    {to_host ? static_cast<void*>(h) : d, to_host ? d : h, static_cast<uint32_t>(block_bytes[c])});
            else if (to_host)
                PG_CUDA_CHECK(cudaMemcpyAsync(host + offset, d, block_bytes[c], cudaMemcpyDeviceToHost, copy_stream_));
            else
                PG_CUDA_CHECK(cudaMemcpyAsync(d, host + offset, block_bytes[c], cudaMemcpyHostToDevice, copy_stream_));
        }
    }
    begin.push_back(list.size());
    static const bool overlap = !env_equals("PEREGRINE_TIER_OVERLAP", "0");
    if (!list.empty()) {
        if (list.size() > host_copy_capacity_) {
            // The old list may still be read by a queued copy kernel: wait for those first.
            PG_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
            if (host_copy_list_) PG_CUDA_CHECK(cudaFree(host_copy_list_));
            host_copy_capacity_ = std::max(list.size(), 2 * host_copy_capacity_);
            PG_CUDA_CHECK(cudaMalloc(&host_copy_list_, host_copy_capacity_ * sizeof(cuda::HostCopy)));
        }
        // From pageable memory: the driver stages it before returning, so `list` may go; the
        // copy is ordered on copy_stream_ after the previous kernels that read the device list.
        PG_CUDA_CHECK(cudaMemcpyAsync(host_copy_list_, list.data(), list.size() * sizeof(cuda::HostCopy),
                                      cudaMemcpyHostToDevice, copy_stream_));
        if (!overlap)
            cuda::host_copies(static_cast<const cuda::HostCopy*>(host_copy_list_), static_cast<int>(list.size()),
                              copy_stream_);
    }
    if (!overlap) {
        // Everything queued on the compute stream from now on (the step) runs after the copies.
        PG_CUDA_CHECK(cudaEventRecord(copy_done_, copy_stream_));
        PG_CUDA_CHECK(cudaStreamWaitEvent(stream_, copy_done_, 0));
        return;
    }
    // A cache's kernel at 64 CTAs (~55 GB/s of PCIe needs ~100 KB in flight; the other SMs run
    // the step beside it), then its event (after any cudaMemcpyAsync piece too: queued before).
    for (size_t c = 0; c < caches.size(); ++c) {
        if (begin[c + 1] > begin[c])
            cuda::host_copies(static_cast<const cuda::HostCopy*>(host_copy_list_) + begin[c],
                              static_cast<int>(begin[c + 1] - begin[c]), copy_stream_, 64);
        while (cache_events_.size() <= c) {
            cudaEvent_t e = nullptr;
            PG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            cache_events_.push_back(e);
        }
        PG_CUDA_CHECK(cudaEventRecord(cache_events_[c], copy_stream_));
        if (const auto it = pending_for(caches[c]); it == pending_.end())
            pending_.emplace_back(caches[c].data, cache_events_[c]);
        else
            it->second = cache_events_[c];
    }
    PG_CUDA_CHECK(cudaEventRecord(copy_done_, copy_stream_));
}

std::vector<std::pair<const void*, cudaEvent_t>>::iterator CudaBackend::pending_for(const Tensor& cache) {
    return std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.first == cache.data; });
}

void CudaBackend::await_cache(const Tensor& cache) {
    if (pending_.empty()) return;
    const auto it = pending_for(cache);
    if (it == pending_.end()) return;
    PG_CUDA_CHECK(cudaStreamWaitEvent(stream_, it->second, 0));
    pending_.erase(it);
}

void CudaBackend::await_all_caches() {
    if (pending_.empty()) return;
    PG_CUDA_CHECK(cudaStreamWaitEvent(stream_, copy_done_, 0));  // recorded after every queued copy
    pending_.clear();
}

void CudaBackend::copy_blocks_to_host(const std::vector<Tensor>& caches,
                                      const std::vector<std::pair<int32_t, int32_t>>& pairs, void* host,
                                      size_t slot_bytes) {
    host_copies(true, caches, pairs, static_cast<char*>(host), slot_bytes);
}

void CudaBackend::copy_blocks_from_host(const void* host, size_t slot_bytes,
                                        const std::vector<std::pair<int32_t, int32_t>>& pairs,
                                        const std::vector<Tensor>& caches) {
    // The copies only read the host memory.
    host_copies(false, caches, pairs, static_cast<char*>(const_cast<void*>(host)), slot_bytes);
}

}  // namespace peregrine
