// Kernels for packed projections: RoPE + KV-cache write reading q | k | v rows of one matmul,
// and SiLU·mul reading gate | up rows. Same arithmetic as rope_and_cache / silu_mul.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_angles.cuh"

namespace peregrine::cuda {

namespace {

__device__ __forceinline__ float ld(const uint16_t* p) {
    return __uint_as_float(static_cast<uint32_t>(*p) << 16);
}
__device__ __forceinline__ uint16_t to_bf16(float x) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    return *reinterpret_cast<const uint16_t*>(&h);
}

// One CTA per token: cos/sin [half] each in shared memory, then one thread per rotated pair of
// every q and k head, then the unrotated k dims and v copied to the cache.
// F8 (k_cache / v_cache null; k8 / v8 the FP8 caches of geometry g8): k (rotated and not) goes
// to shared memory instead, then one warp per (kv head, K or V) quantizes the head into the slot.
template <bool NEOX, bool F8>
__global__ void rope_packed_kernel(uint16_t* __restrict__ qkv, uint16_t* __restrict__ q_out,
                                   const int32_t* __restrict__ positions, const int32_t* __restrict__ slot_mapping,
                                   const float* __restrict__ inv_freq, int rotary_dim, float attention_factor,
                                   int num_heads, int num_kv_heads, int head_dim, uint16_t* __restrict__ k_cache,
                                   uint16_t* __restrict__ v_cache, uint8_t* __restrict__ k8, uint8_t* __restrict__ v8,
                                   const kvf8::Geometry g8) {
    extern __shared__ float cs[];  // [2 * half]: cos then sin; F8: then k [num_kv_heads * head_dim] bf16
    const int64_t t = blockIdx.x;
    const int half = rotary_dim / 2;
    const float pos = static_cast<float>(positions[t]);
    pdl_launch_dependents();
    // Positions and inv_freq were written before the step: the angles need no earlier kernel.
    rope_angles(cs, pos, inv_freq, half, attention_factor);
    __syncthreads();
    pdl_wait();
    const int q_dim = num_heads * head_dim, kv_dim = num_kv_heads * head_dim;
    const uint16_t* row = qkv + t * static_cast<int64_t>(q_dim + 2 * kv_dim);
    const int64_t slot = slot_mapping[t];
    uint16_t* q_row = q_out + t * static_cast<int64_t>(q_dim);
    uint16_t* kc = slot >= 0 ? (F8 ? reinterpret_cast<uint16_t*>(cs + 2 * half) : k_cache + slot * kv_dim) : nullptr;
    uint16_t* vc = !F8 && slot >= 0 ? v_cache + slot * kv_dim : nullptr;

    const int pairs = (num_heads + num_kv_heads) * half;
    for (int it = threadIdx.x; it < pairs; it += blockDim.x) {
        const int h = it / half, i = it % half;
        const bool is_k = h >= num_heads;
        const int a = NEOX ? i : 2 * i, b = NEOX ? i + half : 2 * i + 1;
        const uint16_t* src = row + static_cast<int64_t>(h) * head_dim;  // k heads follow q heads in the row
        uint16_t* dst = is_k ? kc : q_row;
        if (dst == nullptr) continue;
        if (is_k)
            dst += static_cast<int64_t>(h - num_heads) * head_dim;
        else
            dst += static_cast<int64_t>(h) * head_dim;
        const float x0 = ld(src + a), x1 = ld(src + b), c = cs[i], s = cs[half + i];
        dst[a] = to_bf16(rope_rotate(x0, x1, c, s, true));
        dst[b] = to_bf16(rope_rotate(x1, x0, c, s, false));
    }
    // Unrotated dims: q's into q_out, k's into the cache; all of v into the cache.
    const int rest = head_dim - rotary_dim;
    if (rest > 0) {
        for (int it = threadIdx.x; it < (num_heads + num_kv_heads) * rest; it += blockDim.x) {
            const int h = it / rest, d = rotary_dim + it % rest;
            const uint16_t v = row[static_cast<int64_t>(h) * head_dim + d];
            if (h < num_heads)
                q_row[h * head_dim + d] = v;
            else if (kc)
                kc[(h - num_heads) * head_dim + d] = v;
        }
    }
    if constexpr (F8) {
        if (slot < 0) return;  // uniform over the CTA
        __syncthreads();       // k in shared memory
        kvf8::quantize_token(kc, row + q_dim + kv_dim, num_kv_heads, head_dim, k8, v8, g8, slot);
        return;
    }
    if (vc) {
        const uint16_t* v_src = row + q_dim + kv_dim;
        if (kv_dim % 8 == 0) {  // 16-byte copies (rows and slots are 16-byte aligned then)
            for (int e = threadIdx.x * 8; e < kv_dim; e += blockDim.x * 8)
                *reinterpret_cast<uint4*>(vc + e) = *reinterpret_cast<const uint4*>(v_src + e);
        } else {
            for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) vc[e] = v_src[e];
        }
    }
}

// 8 outputs per thread when dim % 8 == 0 (16-byte loads of gate and up), else one.
template <int W>
__global__ void silu_packed_kernel(const uint16_t* __restrict__ gu, uint16_t* __restrict__ out, int64_t n,
                                   int64_t dim) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t per_row = dim / W;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n * per_row) return;
    const int64_t r = idx / per_row, c = (idx % per_row) * W;
    const uint16_t* g = gu + r * 2 * dim + c;
    const uint16_t* u = g + dim;
    uint16_t o[W];
    if constexpr (W == 8) {
        uint4 gv = *reinterpret_cast<const uint4*>(g), uv = *reinterpret_cast<const uint4*>(u);
        const uint16_t* gs = reinterpret_cast<const uint16_t*>(&gv);
        const uint16_t* us = reinterpret_cast<const uint16_t*>(&uv);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float x = ld(gs + j);
            o[j] = to_bf16(x / (1.0f + expf(-x)) * ld(us + j));
        }
        *reinterpret_cast<uint4*>(out + r * dim + c) = *reinterpret_cast<const uint4*>(o);
    } else {
        const float x = ld(g);
        out[r * dim + c] = to_bf16(x / (1.0f + expf(-x)) * ld(u));
    }
}

}  // namespace

namespace {
// rope_and_cache_packed into bf16 caches (k_cache / v_cache) or FP8 ones (k8 / v8 non-null).
void rope_packed_into(bf16_t* qkv, bf16_t* q_out, const DeviceBatch& batch, const float* inv_freq, int rotary_dim,
                      float attention_factor, bool neox, int num_heads, int num_kv_heads, int head_dim, bf16_t* k_cache,
                      bf16_t* v_cache, uint8_t* k8, uint8_t* v8, cudaStream_t stream) {
    const int n = batch.num_tokens;
    if (n <= 0) return;
    if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
        fail("rope_and_cache_packed: rotary_dim ", rotary_dim, " must be even and at most head_dim ", head_dim);
    const bool f8 = k8 != nullptr;
    const kvf8::Geometry g8 =
        f8 ? kvf8::checked_geometry(batch.block_size, num_kv_heads, head_dim, "rope_and_cache_packed")
           : kvf8::Geometry{};
    const int half = std::max(rotary_dim / 2, 1);
    const int pairs = (num_heads + num_kv_heads) * (rotary_dim / 2);
    const int threads = std::clamp((pairs + 31) / 32 * 32, 64, 512);
    // F8: the token's k heads (bf16) after cos | sin.
    const size_t smem = sizeof(float) * 2 * half + (f8 ? sizeof(uint16_t) * num_kv_heads * head_dim : 0);
    auto go = [&](auto kernel) {
        if (smem > 48 * 1024)
            PG_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        launch_pdl(kernel, n, threads, smem, stream, qkv, q_out, batch.positions, batch.slot_mapping, inv_freq,
                   rotary_dim, attention_factor, num_heads, num_kv_heads, head_dim, k_cache, v_cache, k8, v8, g8);
    };
    if (neox)
        f8 ? go(rope_packed_kernel<true, true>) : go(rope_packed_kernel<true, false>);
    else
        f8 ? go(rope_packed_kernel<false, true>) : go(rope_packed_kernel<false, false>);
    check_launch("rope_and_cache_packed");
}
}  // namespace

void rope_and_cache_packed(bf16_t* qkv, bf16_t* q_out, const DeviceBatch& batch, const float* inv_freq, int rotary_dim,
                           float attention_factor, bool neox, int num_heads, int num_kv_heads, int head_dim,
                           bf16_t* k_cache, bf16_t* v_cache, cudaStream_t stream) {
    rope_packed_into(qkv, q_out, batch, inv_freq, rotary_dim, attention_factor, neox, num_heads, num_kv_heads, head_dim,
                     k_cache, v_cache, nullptr, nullptr, stream);
}

void rope_and_cache_packed_fp8(bf16_t* qkv, bf16_t* q_out, const DeviceBatch& batch, const float* inv_freq,
                               int rotary_dim, float attention_factor, bool neox, int num_heads, int num_kv_heads,
                               int head_dim, uint8_t* k_cache, uint8_t* v_cache, cudaStream_t stream) {
    if (k_cache == nullptr || v_cache == nullptr) fail("rope_and_cache_packed_fp8: null cache");
    rope_packed_into(qkv, q_out, batch, inv_freq, rotary_dim, attention_factor, neox, num_heads, num_kv_heads, head_dim,
                     nullptr, nullptr, k_cache, v_cache, stream);
}

void silu_mul_packed(const bf16_t* gate_up, bf16_t* out, int64_t n, int64_t dim, cudaStream_t stream) {
    if (n <= 0 || dim <= 0) return;
    const bool vec =
        dim % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const int64_t items = n * (vec ? dim / 8 : dim);
    const int threads = 256;
    const unsigned blocks = static_cast<unsigned>((items + threads - 1) / threads);
    if (vec)
        launch_pdl(silu_packed_kernel<8>, blocks, threads, 0, stream, gate_up, out, n, dim);
    else
        launch_pdl(silu_packed_kernel<1>, blocks, threads, 0, stream, gate_up, out, n, dim);
    check_launch("silu_mul_packed");
}

}  // namespace peregrine::cuda
