// Products of a few dozen rows (batched decode) with a GGUF device-layout weight, on tensor cores
// and without a bf16 copy of the matrix: out[n, m] (+)= x[n, k] . w[m, k]^T, the weight read
// once and unpacked in registers as the decode products unpack it (gemv.cu), rounded to bf16
// as dequantize_weight rounds it, multiplied by mma.sync with f32 accumulation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/cuda_kernels.h"

namespace peregrine::cuda {

// The most rows of x gguf_gemm takes (8-token tiles: 2, 4 or 8 of them).
constexpr int kGgufGemmMaxRows = 64;

// Whether gguf_gemm takes this product: w a GGUF layout, 1 <= n <= kGgufGemmMaxRows, k a
// multiple of 128, x 16-byte aligned, and n * m partial sums fit `partial_elems` floats.
bool gguf_gemm_supported(GemvWeight w, int n, int m, int k, const void* x, size_t partial_elems);

// out [n, m] = x . w^T (beta 0) or beta * out + x . w^T, out f32 (out_f32) or bf16; x bf16
// [n, k]. Where the weight has few row blocks k is split over several CTAs: their f32 partial
// sums go to `partials` (at most partial_elems floats, device memory no other work uses
// meanwhile) and a second kernel adds them in a fixed order, so results do not depend on timing.
void gguf_gemm(const bf16_t* x, GemvWeight w, void* out, bool out_f32, float beta, int n, int m, int k, float* partials,
               size_t partial_elems, cudaStream_t stream);

// Test and tuning hook: CTAs a streaming multiprocessor the split of k aims at (0: the default,
// or PEREGRINE_GGUF_GEMM_CTAS).
void set_gguf_gemm_ctas_per_sm(int ctas);

}  // namespace peregrine::cuda
