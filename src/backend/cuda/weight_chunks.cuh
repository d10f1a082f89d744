// The weight chunks of the decode products (gemv_kernels.cuh) and of the GGUF tensor-core GEMM
// (gguf_gemm.cu): a product's arguments, and for each weight kind how a thread loads a 16-byte
// chunk of a row and unpacks it, 8 values (a piece) at a time, in element order.
// CUDA-only: include from .cu files (everything here has internal linkage).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace peregrine::cuda {
namespace {

struct Args {
    const void* x;      // [n, k] bf16, or f32 with a norm
    const float* norm;  // [k] RMSNorm weight (NORM) or nullptr
    float eps;
    const void* w;          // [m, k]: bf16, e4m3, or the codes of a GGUF layout (GemvWeight)
    const float* w_scale;   // e4m3: [m] factors per row
    const void* w_factors;  // GGUF layouts: f16 factors per block (gq4_32: f16 pairs)
    void* out;              // [n, m] (silu: [n, m/2] bf16; add: f32, accumulated into)
    bool out_f32;
    int m, k;
};

__device__ __forceinline__ void unpack8(const uint4& v, float f[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
// Piece c (values 8c .. 8c + 7) of token j of a normed product's x ([n, k] f32, written by an
// earlier kernel: plain loads) into v, and of the norm weight into g.
__device__ __forceinline__ void load_normed_piece(const float* x, const float* norm, int64_t k, int j, int c,
                                                  float (&v)[8], float (&g)[8]) {
    const float4* xr = reinterpret_cast<const float4*>(x + j * k) + 2 * c;
    const float4 x0 = xr[0], x1 = xr[1];
    const float4 g0 = __ldg(reinterpret_cast<const float4*>(norm) + 2 * c);
    const float4 g1 = __ldg(reinterpret_cast<const float4*>(norm) + 2 * c + 1);
    v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
    g[0] = g0.x, g[1] = g0.y, g[2] = g0.z, g[3] = g0.w, g[4] = g1.x, g[5] = g1.y, g[6] = g1.z, g[7] = g1.w;
}
__device__ __forceinline__ uint16_t to_bf16(float v) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    return *reinterpret_cast<const uint16_t*>(&h);
}

// Weight kinds (GemvWeight::Kind): bf16; e4m3 with a factor per row; the GGUF device layouts of
// core/dtype.h: int8 codes with an f16 factor per 32 (gq8_32) or 16 (gq8_16) values, 4-bit codes
// with an f16 (scale, min) pair per 32 (gq4_32).
constexpr int kBf16 = GemvWeight::kBf16, kF8 = GemvWeight::kF8, kI8B32 = GemvWeight::kI8B32,
              kI8B16 = GemvWeight::kI8B16, kU4 = GemvWeight::kU4, kU6 = GemvWeight::kU6;
// Layouts whose products multiply x quantized to int8 (XBlock) on dp4a.
template <int W>
constexpr bool kIntX = W == kU4 || W == kU6;

// Chunk c of row `row`: 16 bytes of a row of `row_bytes` bytes.
__device__ __forceinline__ uint4 load16(const void* w, int row, int64_t row_bytes, int c) {
    const char* p = static_cast<const char*>(w) + static_cast<int64_t>(row) * row_bytes;
    return __ldg(reinterpret_cast<const uint4*>(p) + c);
}
// int8 codes (4 in a word) to floats, exactly: the byte with its sign bit flipped is u = code +
// 128, and 2^23 + u is a float whose mantissa holds u (one byte permute and one add a value).
__device__ __forceinline__ float i8_at(uint32_t flipped, int i) {
    return __uint_as_float(__byte_perm(flipped, 0x4B00u, 0x5440u | i)) - 8388736.0f;  // 2^23 + 128
}
__device__ __forceinline__ float f16_bits(uint32_t h) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// A thread's unit of weight: a 16-byte chunk of codes (and for the GGUF layouts its block's
// factors), in kPieces pieces of 8 elements, each multiplying one 8-element piece of x.
template <int W>
struct WeightChunk;
template <>
struct WeightChunk<kBf16> {
    static constexpr int kPieces = 1;
    using Chunk = uint4;
    __host__ __device__ static int64_t row_bytes(int k) { return 2 * static_cast<int64_t>(k); }
    __device__ static Chunk load(const Args& a, int row, int c) { return load16(a.w, row, row_bytes(a.k), c); }
    __device__ static void unpack(const Chunk& v, int, float f[8]) { unpack8(v, f); }
};
template <>
struct WeightChunk<kF8> {
    static constexpr int kPieces = 2;
    using Chunk = uint4;
    __host__ __device__ static int64_t row_bytes(int k) { return k; }
    __device__ static Chunk load(const Args& a, int row, int c) { return load16(a.w, row, row_bytes(a.k), c); }
    __device__ static void unpack(const Chunk& v, int piece, float f[8]) {
        const uint32_t w[2] = {piece == 0 ? v.x : v.z, piece == 0 ? v.y : v.w};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // the low byte pair first: element order
                const __half2_raw r =
                    __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i] >> (16 * h)), __NV_E4M3);
                const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&r));
                f[4 * i + 2 * h] = p.x;
                f[4 * i + 2 * h + 1] = p.y;
            }
        }
    }
};
// A GGUF-layout chunk: 16 bytes of codes and the raw f16 factor(s) of the block it lies in.
struct QuantChunk {
    uint4 q;
    uint32_t f;
};
// int8 codes, 16 a chunk (two pieces), one f16 factor per B values.
template <int B>
struct I8Chunk {
    static constexpr int kPieces = 2;
    using Chunk = QuantChunk;
    __host__ __device__ static int64_t row_bytes(int k) { return k; }
    __device__ static Chunk load(const Args& a, int row, int c) {
        // Chunk c holds values [16c, 16c + 16): factor (16c) / B of the row.
        const auto* f = static_cast<const uint16_t*>(a.w_factors) + static_cast<int64_t>(row) * (a.k / B) + 16 * c / B;
        return {load16(a.w, row, row_bytes(a.k), c), __ldg(f)};
    }
    __device__ static void unpack(const Chunk& v, int piece, float f[8]) {
        const float s = f16_bits(v.f);
        const uint32_t w[2] = {(piece == 0 ? v.q.x : v.q.z) ^ 0x80808080u, (piece == 0 ? v.q.y : v.q.w) ^ 0x80808080u};
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = i8_at(w[e / 4], e % 4) * s;
    }
};
template <>
struct WeightChunk<kI8B32> : I8Chunk<32> {};
template <>
struct WeightChunk<kI8B16> : I8Chunk<16> {};
// 4-bit codes, 32 a chunk (four pieces; byte i holds element 2i low, 2i + 1 high), one f16
// (scale, min) pair per chunk: value = q * scale - min.
template <>
struct WeightChunk<kU4> {
    static constexpr int kPieces = 4;
    using Chunk = QuantChunk;
    __host__ __device__ static int64_t row_bytes(int k) { return k / 2; }
    __device__ static Chunk load(const Args& a, int row, int c) {
        const auto* f = static_cast<const uint32_t*>(a.w_factors) + static_cast<int64_t>(row) * (a.k / 32) + c;
        return {load16(a.w, row, row_bytes(a.k), c), __ldg(f)};
    }
    __device__ static void unpack(const Chunk& v, int piece, float f[8]) {
        const float scale = f16_bits(v.f & 0xffffu), min = f16_bits(v.f >> 16);
        const uint32_t w = piece == 0 ? v.q.x : piece == 1 ? v.q.y : piece == 2 ? v.q.z : v.q.w;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            // 2^23 + q as a float, minus 2^23: q exactly.
            const float q = __uint_as_float(((w >> (4 * e)) & 0xFu) | 0x4B000000u) - 8388608.0f;
            f[e] = fmaf(q, scale, -min);
        }
    }
};
// GQ6_32 (core/dtype.h): a chunk of 32 values is 16 low-nibble bytes (as kU4's), 8 high-bit
// bytes (word h for values 16h..16h + 15) and two f16 scales (values 0-15, 16-31); value =
// (q - 32) * scale with q = low | high << 4. Row r's codes: k / 2 low bytes, then k / 4 high bytes.
struct Q6Chunk {
    uint4 q;
    uint2 h;
    uint32_t f;
};
template <>
struct WeightChunk<kU6> {
    static constexpr int kPieces = 4;
    using Chunk = Q6Chunk;
    __host__ __device__ static int64_t row_bytes(int k) { return 3 * static_cast<int64_t>(k) / 4; }
    __device__ static Chunk load(const Args& a, int row, int c) {
        const char* r = static_cast<const char*>(a.w) + static_cast<int64_t>(row) * row_bytes(a.k);
        const auto* f = static_cast<const uint32_t*>(a.w_factors) + static_cast<int64_t>(row) * (a.k / 32) + c;
        return {load16(a.w, row, row_bytes(a.k), c), __ldg(reinterpret_cast<const uint2*>(r + a.k / 2) + c), __ldg(f)};
    }
    // The 4 codes of piece p (values 8p..8p+7) at even (odd: 1) positions, one a byte, as int8
    // lanes for dp4a: low nibbles | high bits << 4.
    __device__ static uint32_t codes4(const Chunk& v, int p, int odd) {
        const uint32_t w = p == 0 ? v.q.x : p == 1 ? v.q.y : p == 2 ? v.q.z : v.q.w;
        const uint32_t h = p < 2 ? v.h.x : v.h.y;
        return ((w >> (4 * odd)) & 0x0F0F0F0Fu) | (((h >> (4 * (p & 1) + 2 * odd)) & 0x03030303u) << 4);
    }
    __device__ static void unpack(const Chunk& v, int piece, float f[8]) {
        const float s = f16_bits(piece < 2 ? v.f & 0xffffu : v.f >> 16);
        const uint32_t even = codes4(v, piece, 0), odd = codes4(v, piece, 1);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            f[2 * b] = static_cast<float>(static_cast<int>((even >> (8 * b)) & 0xFFu) - 32) * s;
            f[2 * b + 1] = static_cast<float>(static_cast<int>((odd >> (8 * b)) & 0xFFu) - 32) * s;
        }
    }
};

}  // namespace
}  // namespace peregrine::cuda
