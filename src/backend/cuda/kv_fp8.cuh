// The FP8 KV-cache format on the device (core/kv_fp8.h says what it is): where a (slot, kv
// head)'s codes and scale lie, the quantization of a head at write (the same IEEE-rounded steps
// as kv_fp8_quantize_head on the host, so the same bits) and the dequantization of 8 codes at read
// (exact: an E4M3 value is exact in f16 and in f32, and a 4-bit by 8-bit significand product is
// exact in f32). CUDA-only: include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/error.h"

namespace peregrine::cuda::kvf8 {

// One FP8 cache (K or V of one layer): [num_blocks] blocks of block_bytes, each the codes
// [block_size, num_kv_heads, head_dim] u8 and then the scales [block_size, num_kv_heads] bf16.
struct Geometry {
    int64_t block_bytes;  // block_size * num_kv_heads * (head_dim + 2)
    int64_t code_bytes;   // block_size * num_kv_heads * head_dim
    int block_shift;      // block_size == 1 << block_shift
    int num_kv_heads, head_dim;
};

__host__ __device__ inline Geometry geometry(int block_size, int block_shift, int num_kv_heads, int head_dim) {
    Geometry g;
    g.code_bytes = static_cast<int64_t>(block_size) * num_kv_heads * head_dim;
    g.block_bytes = g.code_bytes + static_cast<int64_t>(block_size) * num_kv_heads * 2;
    g.block_shift = block_shift;
    g.num_kv_heads = num_kv_heads;
    g.head_dim = head_dim;
    return g;
}

// The geometry of FP8 caches (host side), refusing shapes the kernels do not take: block_size a
// power of two, head_dim a multiple of 8 and block_size * num_kv_heads a multiple of 4, so that
// every head's codes start 8-byte aligned (the readers load 8 codes at a time).
inline Geometry checked_geometry(int block_size, int num_kv_heads, int head_dim, const char* what) {
    if (block_size <= 0 || (block_size & (block_size - 1)) != 0 || head_dim <= 0 || head_dim % 8 != 0 ||
        num_kv_heads <= 0 || (static_cast<int64_t>(block_size) * num_kv_heads) % 4 != 0)
        fail(what,
             ": an FP8 KV cache needs a power-of-two block size, head_dim a multiple of 8 and block_size x "
             "kv heads a multiple of 4; got block size ",
             block_size, ", ", num_kv_heads, " kv heads of ", head_dim, " (use --block-size 16)");
    return geometry(block_size, __builtin_ctz(static_cast<unsigned>(block_size)), num_kv_heads, head_dim);
}

// Byte offsets from the cache's start of (slot, kvh)'s codes (dim 0) and of its scale.
__device__ __forceinline__ int64_t code_offset(const Geometry& g, int64_t slot, int kvh) {
    const int64_t blk = slot >> g.block_shift, in = slot - (blk << g.block_shift);
    return blk * g.block_bytes + (in * g.num_kv_heads + kvh) * g.head_dim;
}
__device__ __forceinline__ int64_t scale_offset(const Geometry& g, int64_t slot, int kvh) {
    const int64_t blk = slot >> g.block_shift, in = slot - (blk << g.block_shift);
    return blk * g.block_bytes + g.code_bytes + (in * g.num_kv_heads + kvh) * 2;
}

// A stored bf16 scale (its bits) as f32.
__device__ __forceinline__ float scale_value(uint16_t bits) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ float load_scale(const uint8_t* cache, int64_t offset) {
    return scale_value(*reinterpret_cast<const uint16_t*>(cache + offset));
}

// One E4M3 code -> f32 (exact).
__device__ __forceinline__ float value(uint8_t code) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
}

// Two E4M3 codes (low byte first) -> two f32.
__device__ __forceinline__ float2 decode2(uint16_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
    return __half22float2(__half2(h));
}

// 8 codes (little-endian in a uint2: code i in byte i) -> their values f[0..7].
__device__ __forceinline__ void decode8(const uint2& c, float (&f)[8]) {
    const uint32_t w[2] = {c.x, c.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float2 a = decode2(static_cast<uint16_t>(w[i] & 0xffffu));
        const float2 b = decode2(static_cast<uint16_t>(w[i] >> 16));
        f[4 * i + 0] = a.x, f[4 * i + 1] = a.y, f[4 * i + 2] = b.x, f[4 * i + 3] = b.y;
    }
}
// The same values times the head's scale `s` (exact).
__device__ __forceinline__ void dequant8(const uint2& c, float s, float (&f)[8]) {
    decode8(c, f);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] *= s;
}

// The bf16 scale of a head whose largest magnitude is `amax` (bits): bf16(amax / 448), 1 if 0.
__device__ __forceinline__ uint16_t scale_bits(float amax) {
    const uint16_t s = __bfloat16_as_ushort(__float2bfloat16_rn(__fdiv_rn(amax, 448.0f)));
    return (s & 0x7fffu) == 0 ? static_cast<uint16_t>(0x3f80u) : s;
}
// One value's code under a scale's reciprocal `inv` (= __frcp_rn(scale)).
__device__ __forceinline__ uint8_t code(float x, float inv) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(x, inv), __NV_SATFINITE, __NV_E4M3));
}

// Quantizes one head of `head_dim` bf16 values `x` (any 2-byte alignment) into `codes` / `*scale`,
// by one warp (all 32 lanes call it; lanes take d = lane, lane + 32, ...). `x` may have been
// written by this CTA: plain loads, never the read-only path.
__device__ __forceinline__ void quantize_head_warp(const uint16_t* x, int head_dim, uint8_t* codes, uint16_t* scale) {
    const int lane = threadIdx.x & 31;
    float amax = 0.0f;
    for (int d = lane; d < head_dim; d += 32)
        amax = fmaxf(amax, fabsf(__uint_as_float(static_cast<uint32_t>(x[d]) << 16)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const uint16_t s = scale_bits(amax);
    const float inv = __frcp_rn(scale_value(s));
    for (int d = lane; d < head_dim; d += 32) codes[d] = code(__uint_as_float(static_cast<uint32_t>(x[d]) << 16), inv);
    if (lane == 0) *scale = s;
}

// One token's K and V heads (k_row / v_row: [num_kv_heads, head_dim] bf16, possibly written by
// this CTA before a __syncthreads) into cache slot `slot`: a warp per (kv head, K or V), every
// warp of the CTA taking tasks in turn (call from all threads; warp-uniform).
__device__ __forceinline__ void quantize_token(const uint16_t* k_row, const uint16_t* v_row, int num_kv_heads,
                                               int head_dim, uint8_t* k8, uint8_t* v8, const Geometry& g,
                                               int64_t slot) {
    const int warps = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5);
    for (int task = warp; task < 2 * num_kv_heads; task += warps) {
        const int h = task >> 1;
        const bool is_v = task & 1;
        uint8_t* cache = is_v ? v8 : k8;
        quantize_head_warp((is_v ? v_row : k_row) + static_cast<int64_t>(h) * head_dim, head_dim,
                           cache + code_offset(g, slot, h),
                           reinterpret_cast<uint16_t*>(cache + scale_offset(g, slot, h)));
    }
}

}  // namespace peregrine::cuda::kvf8
