// Per-ISA CPU kernels. Each ISA's translation unit fills one table; the backend picks the
// best table the CPU runs (core/cpu_features.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace peregrine::cpu {

struct MatmulArgs {
    const float* x;  // [n, k] row-major activations
    int64_t n;
    int64_t k;
    const void* w;  // [m, k] weights of `w_dtype`, each row `w_row_bytes` long
    DType w_dtype;
    size_t w_row_bytes;
    const float* bias;  // [m] or null
    float* out;         // [n, m] row-major
    int64_t m;
};

struct Kernels {
    const char* name;
    // Computes output columns [m_begin, m_end) of `a.out` (weight rows m_begin..m_end).
    void (*matmul_rows)(const MatmulArgs& a, int64_t m_begin, int64_t m_end);
    float (*dot)(const float* a, const float* b, int64_t n);
    void (*axpy)(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x
    // bf16 x bf16 → f32 products (AVX512-BF16 only; null elsewhere): weights must be bf16 and
    // `x_bf16` is `a.x` rounded to bf16, [n, k]. Same output contract as matmul_rows.
    void (*matmul_bf16_rows)(const MatmulArgs& a, const uint16_t* x_bf16, int64_t m_begin, int64_t m_end);
    // dst[i] = bf16(src[i]), round to nearest even.
    void (*to_bf16)(const float* src, uint16_t* dst, int64_t n);
};

const Kernels& kernels_avx512();
const Kernels& kernels_avx2();

// Whether matmul_rows reads this weight dtype directly.
bool matmul_supports(DType t);

}  // namespace peregrine::cpu
