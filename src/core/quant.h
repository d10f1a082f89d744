// GGUF/ggml block-quantized layouts and their scalar (reference) dequantization.
//
// Every layout here is byte-for-byte ggml's, so GGUF tensor data is used in place. 16-bit
// scales are IEEE f16 bit patterns (see core/half.h). The scalar code is the reference the
// SIMD and CUDA kernels are tested against: keep it obviously correct rather than fast.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/tensor.h"

namespace peregrine {

inline constexpr int kQK8_0 = 32;  // elements per Q8_0 block
inline constexpr int kQK4_0 = 32;  // elements per Q4_0 block
inline constexpr int kQK_K = 256;  // elements per k-quant super-block

// Q8_0: 32 elements, x[i] = d * qs[i].
struct BlockQ8_0 {
    uint16_t d;  // f16 scale
    int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 elements. Byte j holds element j in its low nibble and element j + 16 in its high
// nibble; x = d * (nibble - 8).
struct BlockQ4_0 {
    uint16_t d;  // f16 scale
    uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_K: a super-block of 256 = 8 sub-blocks of 32. Sub-block s has a 6-bit scale sc[s] and a
// 6-bit min m[s] packed into `scales` (see q4_k_scale_min); x = d * sc[s] * q - dmin * m[s]
// with q a 4-bit value. `qs` is four 32-byte chunks; chunk c holds sub-block 2c in its low
// nibbles and sub-block 2c + 1 in its high nibbles (element 32 * (2c) + l is qs[32c + l] & 0xF).
struct BlockQ4_K {
    uint16_t d;             // f16 super-block scale of the sub-block scales
    uint16_t dmin;          // f16 super-block scale of the sub-block mins
    uint8_t scales[12];     // 8 x (6-bit scale, 6-bit min)
    uint8_t qs[kQK_K / 2];  // 4-bit values
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q6_K: a super-block of 256 = 16 sub-blocks of 16, each with an int8 scale; x = d * scales[s] *
// (q - 32) with q a 6-bit value: low 4 bits in `ql`, high 2 bits in `qh`. Two halves of 128
// elements; half h uses ql[64h .. 64h+64), qh[32h .. 32h+32), scales[8h .. 8h+8). Within a half,
// for l in [0, 32): element l      = ql[l] & 0xF      | ((qh[l] >> 0) & 3) << 4
//                   element l + 32 = ql[l + 32] & 0xF | ((qh[l] >> 2) & 3) << 4
//                   element l + 64 = ql[l] >> 4       | ((qh[l] >> 4) & 3) << 4
//                   element l + 96 = ql[l + 32] >> 4  | ((qh[l] >> 6) & 3) << 4
// and element e of the half uses scales[8h + e / 16].
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];  // low 4 bits
    uint8_t qh[kQK_K / 4];  // high 2 bits
    int8_t scales[kQK_K / 16];
    uint16_t d;  // f16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// Block `i` copied out of an unaligned byte stream of blocks (the compiler makes plain loads).
template <typename Block>
Block load_block(const uint8_t* src, int64_t i) {
    Block b;
    std::memcpy(&b, src + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
    return b;
}

// The 256 signed 6-bit codes q - 32 of a Q6_K super-block, in element order (layout: BlockQ6_K).
void q6_k_codes(const BlockQ6_K& b, int8_t q[kQK_K]);

// Unpacks the 6-bit scale and min of Q4_K sub-block `j` (0..7) from the 12 packed bytes:
// sub-blocks 0-3 are the low 6 bits of bytes j (scale) and j + 4 (min); sub-blocks 4-7 take
// their low 4 bits from byte j + 4 (scale: low nibble, min: high nibble) and their high 2 bits
// from the top bits of bytes j - 4 (scale) and j (min).
void q4_k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m);

// Dequantizes `n` elements (a multiple of dtype_block_size(t)) of type t (F32, F16, BF16, Q8_0,
// Q4_0, Q4_K, Q6_K) from src into dst (f32). src needs no particular alignment. Aborts
// (PG_CHECK) for the GQ device layouts, whose rows are not contiguous: core/gpu_quant.h reads them.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Elements [first, first + n) of row r of host matrix t (t seen as [rows(), cols()]; first and
// n whole blocks of t's dtype; n < 0: to the row's end) into dst as f32, with the row's factor
// applied: an f8_e4m3 element is value * t.scale[r] (core/tensor.h), and one without factors
// is an error. Every conversion of a weight matrix goes through here so none drops a factor.
void dequantize_tensor_row(const Tensor& t, int64_t r, float* dst, int64_t first = 0, int64_t n = -1);

// --- 8-bit activations for the CPU's int8 dot kernels ------------------------------------
//
// A matmul with quantized weights first quantizes each activation row (k values, k a multiple
// of 32) into blocks of 32 with an f32 scale; the kernels then meet the weights' integer values
// in integer dot products. One row is act_row_bytes(k) bytes (a multiple of 64):
//   int8  q[k]         q[i] = round-half-even(x[i] * (127 / amax)), amax = max |x| of its block
//                      (q = 0 for a block of zeros)
//   float d[k / 32]    amax / 127, so x[i] ~ d[i / 32] * q[i]
//   float xs[k / 32]   d[b] * (sum of q over block b): the term Q4_K's per-block mins multiply
//   int32 off[k / 16]  -c * (sum of q over each weight sub-block), where the kernels read the
//                      weights' values as unsigned u = v + c: Q8_0 (c = 128) and Q4_0 (c = 8)
//                      over blocks of 32 (entries [0, k / 32)), Q6_K (c = 32) over blocks of 16;
//                      zero for other types
struct ActRow {
    int8_t* q;
    float* d;
    float* xs;
    int32_t* off;
};
inline constexpr int kActBlock = 32;
inline size_t act_row_bytes(int64_t k) {
    return (static_cast<size_t>(k) * 3 / 2 + 63) / 64 * 64;
}
inline ActRow act_row(void* row, int64_t k) {
    auto* b = static_cast<uint8_t*>(row);
    return {reinterpret_cast<int8_t*>(b), reinterpret_cast<float*>(b + k), reinterpret_cast<float*>(b + k + k / 8),
            reinterpret_cast<int32_t*>(b + k + k / 4)};
}
// The offset c and its sub-block length for weights of type `w` (0 and 32 where none applies).
int act_offset(DType w);
int act_offset_block(DType w);

// Scalar reference of the kernels' activation quantization (bit for bit the same result): one
// row of k values into `dst` (act_row_bytes(k) bytes) for weights of type `w`.
void quantize_act_row(DType w, const float* x, int64_t k, void* dst);

// Quantizes n (a multiple of 32) f32 values into Q8_0 blocks, as ggml does: d = max|x| / 127
// (stored as f16), q = round-half-away-from-zero(x * (1 / d)) with the unrounded f32 d, so the
// bytes match llama.cpp's activation quantization. Inputs must be finite.
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

}  // namespace peregrine
