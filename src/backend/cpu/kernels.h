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

// One token's attention for the query heads that share one KV head (GQA), over keys
// [first, last] of its sequence, read through the block table.
struct AttentionArgs {
    const float* q;        // [group, head_dim]: the query heads of one kv head, consecutive
    const float* k_cache;  // [num_blocks * block_size, kv_dim]
    const float* v_cache;  // same
    int64_t kv_dim;        // floats per cache slot (num_kv_heads * head_dim)
    int64_t head_offset;   // this kv head's offset inside a slot
    const int32_t* table;  // the sequence's block table
    int block_size;
    int head_dim;
    int group;  // query heads per kv head
    float scale;
    int first, last;  // key positions, inclusive
    float* out;       // [group, head_dim]
    float* scratch;   // [group * (last - first + 1)] scores
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
    void (*attention)(const AttentionArgs& a);
    // out[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i]; exp to about 2 ulp. `out` may
    // alias `g`.
    void (*silu_mul)(const float* g, const float* u, float* out, int64_t n);

    // The int8 path of quantized weights (Q8_0, Q4_0, Q4_K, Q6_K). `quantize_acts` writes rows
    // [0, n) of `x` [n, k] as 8-bit activations for weights of `w_dtype`, act_row_bytes(k) apart
    // (core/quant.h); `qmatmul_rows` then computes output columns [m_begin, m_end) of `a.out`
    // from them (a.x is not read). `scratch`: qmatmul_scratch_bytes(a.k) bytes for the calling
    // thread (weight panels unpacked for prefill), 64-byte aligned.
    void (*quantize_acts)(DType w_dtype, const float* x, int64_t n, int64_t k, uint8_t* dst);
    void (*qmatmul_rows)(const MatmulArgs& a, const uint8_t* xq, int64_t m_begin, int64_t m_end, uint8_t* scratch);
    // Output columns that threads should not split (a weight panel), for `a`'s shape.
    int64_t (*qmatmul_align)(const MatmulArgs& a);
    const char* qmatmul_name;  // e.g. "int8 dot: avx512-vnni"
};

size_t qmatmul_scratch_bytes(int64_t k);

const Kernels& kernels_avx512();
const Kernels& kernels_avx2();

// Whether matmul_rows reads this weight dtype directly (f32 activations).
bool matmul_supports(DType t);
// Whether qmatmul_rows reads it (8-bit activations): the block-quantized types.
bool qmatmul_supports(DType t);

// The table of this ISA with its int8 path replaced by AVX2's: for AVX-512 CPUs without VNNI.
const Kernels& kernels_avx512_no_vnni();

}  // namespace peregrine::cpu
