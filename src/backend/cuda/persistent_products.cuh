// What the persistent decode products (gemv_kernels.cuh's gemv_persistent_kernel, gemv_mma.cu)
// share: a grid sized to the resident slots, the weights prefetched to L2 before the wait, x
// staged in shared memory within a bound.
// CUDA-only: include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace peregrine::cuda {

// Weight bytes all of a product's CTAs together prefetch to L2 before the wait. H100, 1B decode
// with the o / down products persistent: 0 / 4 / 8 / 16 / 32 MB gave 940-945 / 944-946 / 940 /
// 917-918 / 866-876 tok/s (more competes with the previous kernel's tail for DRAM).
constexpr int64_t kPrefetchBytes = int64_t{8} << 20;
// The most bytes of x a CTA stages in shared memory (227 KB per CTA at most on Hopper, the rest
// left for a second CTA and the next kernel's).
constexpr size_t kMaxStagedX = 96 * 1024;

// Resident CTAs per SM (at least 1) of Kernel with `threads` threads and `smem` dynamic bytes,
// after opting it into that much shared memory. Cached per device with the smem it was computed
// for: an instantiation usually meets one k.
template <auto Kernel>
int resident_ctas(int threads, size_t smem) {
    static std::atomic<uint64_t> cache[64];
    int dev = 0;
    PG_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<uint64_t>& slot = cache[dev & 63];
    const uint64_t c = slot.load(std::memory_order_relaxed);
    if (c != 0 && (c >> 32) == smem) return static_cast<int>(c & 0xffffffffu);
    PG_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int v = 0;
    PG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, Kernel, threads, smem));
    v = std::max(v, 1);
    slot.store((static_cast<uint64_t>(smem) << 32) | static_cast<uint32_t>(v), std::memory_order_relaxed);
    return v;
}

// The first `bytes` of a CTA's rows at p towards L2, a 128-byte line a thread at a time (threads:
// the CTA's), capped at the CTA's share of kPrefetchBytes (halves: the row ranges it prefetches,
// 2 for gate | up). Call before pdl_wait: weights are not written by earlier kernels.
__device__ __forceinline__ void prefetch_rows_l2(const char* p, int64_t bytes, int halves, int threads) {
    bytes = min(bytes, kPrefetchBytes / gridDim.x / halves);
    for (int64_t i = threadIdx.x; i * 128 < bytes; i += threads)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i * 128));
}

}  // namespace peregrine::cuda
