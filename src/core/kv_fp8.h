// The FP8 KV-cache format (--kv-cache-dtype fp8): OCP E4M3 codes with one bf16 scale per (token,
// kv head), computed when the token is written and never revisited.
//
// A head's head_dim values x quantize as
//   s = bf16(amax(|x|) / 448), or 1 when that is 0 (an all-zero head: codes 0)
//   code[d] = e4m3(x[d] * (1 / s))   round to nearest even, saturating at +-448 (f32_to_f8e4m3)
// and read back as value[d] = e4m3_value(code[d]) * s, exact in f32 (a 4-bit by an 8-bit
// significand). The scale is rounded to bf16 before quantizing, so what is read is exactly what
// the codes and the stored scale say. Every step is IEEE-rounded f32 (no contraction), so the GPU
// (kv_fp8.cuh) gets the same bits.
//
// A layer's K (and V) cache is one byte tensor of dtype F8_E4M3 and shape
// [num_blocks, block_size, num_kv_heads, head_dim + 2]: each block is block_size * num_kv_heads
// * (head_dim + 2) contiguous bytes, laid out as
//   codes  [block_size, num_kv_heads, head_dim] u8
//   scales [block_size, num_kv_heads] bf16
// The shape gives the block's byte count (so block copies, the host and disk tiers and the pool
// sizing work by bytes as for bf16) and its geometry (dims 1 and 2, head_dim = cols() - 2); its
// rows do not address (token, head) rows. Bytes per (token, head): head_dim + 2, against
// 2 * head_dim for bf16 (1.94x fewer at head_dim 64, 1.97x at 128).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace peregrine {

// Where one (slot, kv head) lives inside an FP8 cache; slot = block * block_size + i.
struct KvFp8Layout {
    int64_t block_size = 0, num_kv_heads = 0, head_dim = 0;

    int64_t code_bytes() const { return block_size * num_kv_heads * head_dim; }  // of one block
    int64_t block_bytes() const { return block_size * num_kv_heads * (head_dim + 2); }
    // Byte offsets from the cache's start.
    int64_t code_offset(int64_t slot, int64_t kvh) const {
        return slot / block_size * block_bytes() + (slot % block_size * num_kv_heads + kvh) * head_dim;
    }
    int64_t scale_offset(int64_t slot, int64_t kvh) const {
        return slot / block_size * block_bytes() + code_bytes() + (slot % block_size * num_kv_heads + kvh) * 2;
    }
};

constexpr float kKvFp8Max = 448.0f;  // the largest finite E4M3 value

// The layout of an FP8 cache tensor (checks its dtype and shape).
KvFp8Layout kv_fp8_layout(const Tensor& cache);
// The cache tensor's last dimension for a head size: head_dim codes + 2 scale bytes.
inline int64_t kv_fp8_cols(int64_t head_dim) {
    return head_dim + 2;
}

// The bf16 scale (bits) of a head whose largest magnitude is `amax`.
uint16_t kv_fp8_scale(float amax);
// Quantizes one head: x [head_dim] -> codes [head_dim], *scale (bf16 bits).
void kv_fp8_quantize_head(const float* x, int64_t head_dim, uint8_t* codes, uint16_t* scale);
// out[d] = value(codes[d]) * scale, exactly.
void kv_fp8_dequantize_head(const uint8_t* codes, uint16_t scale, int64_t head_dim, float* out);

}  // namespace peregrine
