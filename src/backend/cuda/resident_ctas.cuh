// Occupancy of a kernel that sizes its grid to the resident slots (the persistent decode
// products of gemv.cu and gemv_mma.cu).
// CUDA-only: include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace peregrine::cuda {

// Resident CTAs per SM (at least 1) of `kernel` with `threads` threads and `smem` dynamic bytes,
// after opting it into that much shared memory. Cached per device in `cache` (one array per
// kernel) with the smem it was computed for: an instantiation usually meets one k.
template <typename... Args>
int resident_ctas(void (*kernel)(Args...), int threads, size_t smem, std::atomic<uint64_t> (&cache)[64]) {
    int dev = 0;
    PG_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<uint64_t>& slot = cache[dev & 63];
    const uint64_t c = slot.load(std::memory_order_relaxed);
    if (c != 0 && (c >> 32) == smem) return static_cast<int>(c & 0xffffffffu);
    PG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int v = 0;
    PG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, threads, smem));
    v = std::max(v, 1);
    slot.store((static_cast<uint64_t>(smem) << 32) | static_cast<uint32_t>(v), std::memory_order_relaxed);
    return v;
}

}  // namespace peregrine::cuda
