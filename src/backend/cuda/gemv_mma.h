// Decode products on tensor cores: gemv.cu hands them its FP8 (E4M3, one f32 factor per row) and
// bf16 products of 1-8 rows of x where they apply (gemv_mma.cu says how and why; past
// kMaxGemvRows rows only this kernel runs them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace peregrine::cuda {

// mma's A has 16 rows: 8 tokens of x (hi alone, the other 8 rows 0), or 4 of hi + lo; a kernel
// for each row count. (A 16-row kernel, tokens 8-15 in rows 8-15, lost to cuBLASLt at batch 16 by
// 28-30% on FP8, even on bf16: H200, session 32. Removed.)
constexpr int kMaxMmaRows = 8;

struct MmaProduct {
    enum Epilogue { kPlain, kSilu, kAdd };  // as gemv, gemv_silu, gemv_add
    enum Weight { kBf16, kF8 };
    const void* x;      // [n, k] bf16, or with norm the f32 residual stream
    const float* norm;  // [k] RMSNorm weight, or nullptr
    float eps;
    Weight weight;
    const void* w;       // [m, k] bf16 values or e4m3 codes
    const float* scale;  // e4m3: [m] row factors
    void* out;           // [n, m] f32 / bf16 (silu: [n, m / 2] bf16; add: f32, accumulated into)
    bool out_f32;
    int n, m, k;
    Epilogue epilogue;
};

// Launches the product and returns true, or returns false without launching where it does not
// take it (k not a multiple of 64, n outside 1..kMaxMmaRows, x too long to stage, switched off:
// then the caller runs its own kernel).
bool gemv_mma(const MmaProduct& p, cudaStream_t stream);
// Whether gemv_mma would take p (out is not looked at): the backend asks it before it hands a
// product of 3-8 rows to the decode kernels rather than to cuBLASLt.
bool gemv_mma_takes(const MmaProduct& p);

// Test and measurement hook for one weight kind: 1 on, 0 off, 2 auto (FP8: on; bf16: the
// products measured faster here, see bf16_auto), -1 (default) the environment decides:
// PEREGRINE_FP8_GEMV = mma (default) | fma, PEREGRINE_BF16_GEMV = auto (default) | mma | fma,
// fma being gemv.cu's kernels.
void set_gemv_mma(MmaProduct::Weight weight, int mode);
// Test and measurement hook: how a normed x of 1-4 rows is staged for FP8 weights: 1 hi + lo
// (~f32), 0 f16 hi alone (half the bytes), -1 (default) the environment decides
// (PEREGRINE_FP8_NORM_LO = 1; else hi alone).
void set_fp8_norm_lo(int mode);

}  // namespace peregrine::cuda
