// Products with a GGUF device-layout weight past the decode kernels' few rows (batched decode,
// prefill), on tensor cores and without a bf16 copy of the matrix: out[n, m] (+)= x[n, k] .
// w[m, k]^T, the weight unpacked in registers as the decode products unpack it
// (gemv_kernels.cuh), rounded to bf16 as dequantize_weight rounds it, multiplied by mma.sync with
// f32 accumulation. Up to 64 rows of x the weight is read once; past that, once a tile of 64 rows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/cuda_kernels.h"

namespace peregrine::cuda {

// The rows of x one CTA takes at most (8-token tiles: 2, 4 or 8 of them); more rows are split
// into tiles of this many.
constexpr int kGgufGemmMaxRows = 64;

// Whether gguf_gemm takes this product: w a GGUF layout, n, m >= 1, k a multiple of 128, x
// 16-byte aligned.
bool gguf_gemm_supported(GemvWeight w, int n, int m, int k, const void* x);

// out [n, m] = x . w^T (beta 0) or beta * out + x . w^T, out f32 (out_f32) or bf16; x bf16
// [n, k]. Where the grid has few CTAs k is split over several: their f32 partial sums go to
// `partials` (at most partial_elems floats, device memory no other work uses meanwhile; null or
// too small for two splits: one split) and a second kernel adds them in a fixed order, so results
// do not depend on timing.
void gguf_gemm(const bf16_t* x, GemvWeight w, void* out, bool out_f32, float beta, int n, int m, int k, float* partials,
               size_t partial_elems, cudaStream_t stream);

// Test and tuning hook: CTAs a streaming multiprocessor the split of k aims at (0: the default,
// or PEREGRINE_GGUF_GEMM_CTAS).
void set_gguf_gemm_ctas_per_sm(int ctas);

}  // namespace peregrine::cuda
