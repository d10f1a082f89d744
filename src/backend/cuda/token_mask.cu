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

// One thread per 32-bit mask word (32 token ids); grid.y = the constrained row. Ids whose bit
// is clear become -inf. Words past the mask (a vocabulary larger than the tokenizer's, padded
// rows) are all-clear: those ids are never allowed.
__global__ void apply_token_masks_kernel(float* logits, int vocab, const uint32_t* masks, const int32_t* rows,
                                         int words) {
    const int m = blockIdx.y;
    const int w = blockIdx.x * kMaskThreads + threadIdx.x;
    const int first = w * 32;
    if (first >= vocab) return;
    const uint32_t bits = w < words ? masks[static_cast<int64_t>(m) * words + w] : 0u;
    if (bits == 0xffffffffu) return;
    float* row = logits + static_cast<int64_t>(rows[m]) * vocab;
    const int end = min(first + 32, vocab);
    for (int t = first; t < end; ++t)
        if (!((bits >> (t - first)) & 1u)) row[t] = -INFINITY;
}

}  // namespace

void apply_token_masks(float* logits, int vocab, const uint32_t* masks, const int32_t* rows, int m, int words,
                       cudaStream_t stream) {
    if (m <= 0) return;
    const int vocab_words = (vocab + 31) / 32;
    const dim3 grid(static_cast<unsigned>((vocab_words + kMaskThreads - 1) / kMaskThreads), static_cast<unsigned>(m));
    apply_token_masks_kernel<<<grid, kMaskThreads, 0, stream>>>(logits, vocab, masks, rows, words);
    check_launch("apply_token_masks");
}

}  // namespace peregrine::cuda
