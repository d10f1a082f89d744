// Structured output on the GPU: the grammar's allowed-token bitmask applied to logits rows
// before the sampling kernels (greedy or not), so a constrained row is drawn on the device like
// any other and its step keeps async scheduling.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"

namespace peregrine::cuda {

namespace {

constexpr int kMaskThreads = 256;
constexpr int kTokensPerThread = 4;  // a block covers 1024 ids

// grid.x covers the vocabulary, grid.y = the constrained row. Thread i of a block handles ids
// base + i, base + i + 256, ...: each store of a warp is 32 consecutive floats (coalesced; a
// thread per mask word, writing 32 ids in a row, made every store touch 32 lines). Ids whose
// bit is clear become -inf; ids past the mask's words are never allowed.
__global__ void apply_token_masks_kernel(float* logits, int vocab, const uint32_t* masks, const int32_t* rows,
                                         int words) {
    const int m = blockIdx.y;
    const uint32_t* mask = masks + static_cast<int64_t>(m) * words;
    float* row = logits + static_cast<int64_t>(rows[m]) * vocab;
    const int base = blockIdx.x * kMaskThreads * kTokensPerThread + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kTokensPerThread; ++k) {
        const int t = base + k * kMaskThreads;
        if (t >= vocab) return;
        const int w = t >> 5;
        const uint32_t bits = w < words ? __ldg(mask + w) : 0u;  // one load per warp (same word)
        if (!((bits >> (t & 31)) & 1u)) row[t] = -INFINITY;
    }
}

}  // namespace

void apply_token_masks(float* logits, int vocab, const uint32_t* masks, const int32_t* rows, int m, int words,
                       cudaStream_t stream) {
    if (m <= 0) return;
    constexpr int per_block = kMaskThreads * kTokensPerThread;
    const dim3 grid(static_cast<unsigned>((vocab + per_block - 1) / per_block), static_cast<unsigned>(m));
    apply_token_masks_kernel<<<grid, kMaskThreads, 0, stream>>>(logits, vocab, masks, rows, words);
    check_launch("apply_token_masks");
}

}  // namespace peregrine::cuda
