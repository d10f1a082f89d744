// Internals of gemm_invariant (gemm_invariant*.cu): the constants that define the canonical k
// order, the per-chunk tensor-core step every kernel shares, and the kernel families' launchers.
// CUDA-only: include from .cu files. gemm_invariant.cu describes the canonical computation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/warp_mma.cuh"

namespace peregrine::cuda::ginv {

// The canonical order (changing either changes the bits of every product):
constexpr int kSlices = 8;  // k slices, each one accumulator chain, added in slice order
constexpr int kChunk = 32;  // k values per chunk: two mma k-steps on one 16-byte word per lane

struct Problem {
    const bf16_t* x;  // [n, k]
    const bf16_t* w;  // [m, k]
    void* out;        // [n, m] f32 or bf16
    bool out_f32;
    int n, m, k;
    int chunks;  // ceil(k / kChunk)
    int per;     // chunks per slice: ceil(chunks / kSlices)
    cudaStream_t stream;
};

// acc += one chunk: xa, xb the 16-byte words of tokens g and g + 8, wv that of weight row g
// (lane = 4 g + q holds values [32 c + 8 q, +8) of its rows). The first mma takes values 0-3 of
// each word, the second values 4-7.
__device__ __forceinline__ void chunk_mma(float (&acc)[4], const uint4& xa, const uint4& xb, const uint4& wv) {
    const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y};
    mma_bf16_16816(acc, a0, wv.x, wv.y);
    const uint32_t a1[4] = {xa.z, xb.z, xa.w, xb.w};
    mma_bf16_16816(acc, a1, wv.z, wv.w);
}

__device__ __forceinline__ uint16_t bf16_bits(float v) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    return *reinterpret_cast<const uint16_t*>(&h);
}

__device__ __forceinline__ void store_out(void* out, bool out_f32, int64_t idx, float v) {
    if (out_f32)
        static_cast<float*>(out)[idx] = v;
    else
        static_cast<uint16_t*>(out)[idx] = bf16_bits(v);
}

// Raises a kernel's dynamic shared-memory limit once per process and device.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, std::atomic<uint64_t>& done) {
    int dev = 0;
    PG_CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = uint64_t{1} << (dev & 63);
    if (done.load(std::memory_order_relaxed) & bit) return;
    PG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    PG_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    done.fetch_or(bit, std::memory_order_relaxed);
}

// Launchers (the caller checks the launch). sliced / tiled need k % 8 == 0 and 16-byte aligned
// x and w; skinny takes anything.
void launch_skinny(const Problem& p, int row_groups, bool vec);  // gemm_invariant.cu
void launch_sliced(const Problem& p, GemmInvariantPlan plan);    // gemm_invariant_sliced.cu
void launch_tiled(const Problem& p, GemmInvariantPlan plan);     // gemm_invariant_tiled.cu

}  // namespace peregrine::cuda::ginv
