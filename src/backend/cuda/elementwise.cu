// Elementwise and data-movement kernels of the CUDA backend: embedding, rms_norm (+ residual),
// rope + KV-cache write, silu·mul, row gather, KV block copy, dummy-weight fill, bias add.
// All math in f32; bf16 stores round to nearest even. Each kernel has a 16-byte vector path
// (8 bf16 per access) taken when the sizes and pointers allow it, and a scalar fallback.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/e4m3_rows.cuh"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_angles.cuh"

namespace peregrine::cuda {

namespace {

// ---- scalar and vector helpers -------------------------------------------------------------

__device__ __forceinline__ float bf2f(uint16_t h) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ __forceinline__ uint16_t f2bf(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ uint32_t pack2(float a, float b) {
    return static_cast<uint32_t>(f2bf(a)) | (static_cast<uint32_t>(f2bf(b)) << 16);
}
__device__ __forceinline__ void unpack2(uint32_t u, float& a, float& b) {
    a = __uint_as_float(u << 16);
    b = __uint_as_float(u & 0xffff0000u);
}

// Loads N consecutive elements (float or bf16 bits) as f32; p must be aligned to N elements
// (the launchers check this before choosing N > 1).
template <int N>
__device__ __forceinline__ void load_n(const float* p, float (&v)[N]) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int j = 0; j < N / 4; ++j) {
            const float4 f = reinterpret_cast<const float4*>(p)[j];
            v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
        }
    } else if constexpr (N == 2) {
        const float2 f = *reinterpret_cast<const float2*>(p);
        v[0] = f.x, v[1] = f.y;
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = p[j];
    }
}
template <int N>
__device__ __forceinline__ void load_n(const uint16_t* p, float (&v)[N]) {
    if constexpr (N == 8) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        unpack2(u.x, v[0], v[1]), unpack2(u.y, v[2], v[3]), unpack2(u.z, v[4], v[5]), unpack2(u.w, v[6], v[7]);
    } else if constexpr (N == 4) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        unpack2(u.x, v[0], v[1]), unpack2(u.y, v[2], v[3]);
    } else if constexpr (N == 2) {
        unpack2(*reinterpret_cast<const uint32_t*>(p), v[0], v[1]);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = bf2f(p[j]);
    }
}
template <int N>
__device__ __forceinline__ void store_n(float* p, const float (&v)[N]) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int j = 0; j < N / 4; ++j)
            reinterpret_cast<float4*>(p)[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    } else if constexpr (N == 2) {
        *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) p[j] = v[j];
    }
}
template <int N>
__device__ __forceinline__ void store_n(uint16_t* p, const float (&v)[N]) {
    if constexpr (N == 8) {
        *reinterpret_cast<uint4*>(p) =
            make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
    } else if constexpr (N == 4) {
        *reinterpret_cast<uint2*>(p) = make_uint2(pack2(v[0], v[1]), pack2(v[2], v[3]));
    } else if constexpr (N == 2) {
        *reinterpret_cast<uint32_t*>(p) = pack2(v[0], v[1]);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) p[j] = f2bf(v[j]);
    }
}

// Raw copy of N bf16 values (no conversion).
template <int N>
__device__ __forceinline__ void copy_n(uint16_t* dst, const uint16_t* src) {
    if constexpr (N == 8) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else if constexpr (N == 4) {
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
    } else if constexpr (N == 2) {
        *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) dst[j] = src[j];
    }
}

inline bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}
inline bool aligned_to(const void* p, size_t bytes) {
    return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}
inline int round_up(int x, int m) {
    return (x + m - 1) / m * m;
}
inline int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// Grid size of a grid-stride loop over `work` items of `threads` per block.
inline unsigned grid_for(int64_t work, int threads) {
    return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(work, threads), 1, 8192));
}

// ---- embedding -----------------------------------------------------------------------------

// out[row, :] = f32(table[ids[row] - vocab_begin, :]); one CTA per row; id -1 - j reads feed[j]
// (when given); ids outside [vocab_begin, vocab_begin + vocab_rows) (another tensor-parallel
// rank's rows) and other negative ids give zeros.
template <int V>
__global__ void embedding_kernel(const uint16_t* __restrict__ table, const int32_t* __restrict__ ids,
                                 const int32_t* feed, int hidden, int vocab_begin, int vocab_rows,
                                 float* __restrict__ out) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t row = blockIdx.x;
    int32_t id = ids[row];
    if (id < 0 && feed) id = feed[-1 - id];  // written by the previous step's sampler
    id = id >= vocab_begin && id - vocab_begin < vocab_rows ? id - vocab_begin : -1;
    const uint16_t* src = table + static_cast<int64_t>(id) * hidden;
    float* dst = out + row * hidden;
    for (int c = threadIdx.x * V; c < hidden; c += blockDim.x * V) {
        float v[V];
        if (id >= 0) {
            load_n<V>(src + c, v);
        } else {
#pragma unroll
            for (int j = 0; j < V; ++j) v[j] = 0.0f;
        }
        store_n<V>(dst + c, v);
    }
}

// ---- rms_norm ------------------------------------------------------------------------------

// TPR threads per row (blockDim.x / TPR rows per CTA when TPR <= 32, else one row per CTA),
// each handling vectors i = lane + j * TPR of V elements. NV > 0: the row stays in registers
// (NV vectors per thread cover it); NV == 0: any length, the second pass re-reads from memory.
// OT uint8_t: out gets the row's e4m3 codes and qscale[row] its factor, quantized from the
// bf16-rounded outputs as quantize_rows_e4m3 would quantize the bf16 row (bit for bit; NV > 0).
template <typename XT, typename OT, bool RES, int V, int NV>
__global__ void rms_norm_kernel(const XT* x, float* __restrict__ residual, const float* __restrict__ weight, float eps,
                                OT* out, int rows, int dim, int tpr, float* __restrict__ qscale) {
    constexpr bool kCodes = std::is_same_v<OT, uint8_t>;
    static_assert(!kCodes || NV > 0, "e4m3 output keeps the row in registers");
    pdl_launch_dependents();
    // The norm weight is constant during a step: bring it towards L2 before waiting for x.
    for (int line = threadIdx.x; line * 32 < dim; line += blockDim.x)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(weight + line * 32));
    pdl_wait();
    __shared__ float partial[32];
    const int lane = threadIdx.x % tpr;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
    const bool valid = row < rows;  // only in the multi-row (TPR <= 32) case can this be false
    const int nvec = dim / V;
    const XT* xr = x + row * dim;
    float* rr = RES ? residual + row * dim : nullptr;
    OT* orow = out + row * dim;

    constexpr int kCache = NV > 0 ? NV : 1;
    float cache[kCache][V];
    float ss = 0.0f;
    auto first_pass = [&](int i, float(&v)[V]) {
        load_n<V>(xr + i * V, v);
        if constexpr (RES) {
            float r[V];
            load_n<V>(rr + i * V, r);
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = r[e] + v[e];
            store_n<V>(rr + i * V, v);
        }
#pragma unroll
        for (int e = 0; e < V; ++e) ss += v[e] * v[e];
    };
    if (valid) {
        if constexpr (NV > 0) {
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int i = lane + j * tpr;
                if (i < nvec) first_pass(i, cache[j]);
            }
        } else {
            for (int i = lane; i < nvec; i += tpr) first_pass(i, cache[0]);
        }
    }

    // Combines v over the row's threads: within the warp (groups of tpr lanes when tpr < 32),
    // then across warps through shared memory, warp 0's part first.
    auto reduce_row = [&](float v, auto op) {
        for (int off = min(tpr, 32) / 2; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (tpr > 32) {
            const int warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
            __syncthreads();  // an earlier reduction's reads of partial are done
            if (threadIdx.x % 32 == 0) partial[warp] = v;
            __syncthreads();
            v = partial[0];
            for (int w = 1; w < num_warps; ++w) v = op(v, partial[w]);
        }
        return v;
    };
    ss = reduce_row(ss, [](float a, float b) { return a + b; });
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    if constexpr (kCodes) {
        // Every thread reaches the amax reduction (its shuffles span whole warps); rows past
        // the end contribute 0 and store nothing.
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int i = lane + j * tpr;
            if (!valid || i >= nvec) continue;
            float w[V];
            load_n<V>(weight + i * V, w);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                cache[j][e] = bf2f(f2bf(w[e] * (cache[j][e] * inv)));
                amax = fmaxf(amax, fabsf(cache[j][e]));
            }
        }
        amax = reduce_row(amax, [](float a, float b) { return fmaxf(a, b); });
        if (!valid) return;
        const float q = e4m3_rows::multiplier(amax);
        if (lane == 0) qscale[row] = e4m3_rows::factor(amax);
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int i = lane + j * tpr;
            if (i >= nvec) continue;
            uint8_t c[V];
#pragma unroll
            for (int e = 0; e < V; ++e) c[e] = e4m3_rows::code(cache[j][e] * q);
            if constexpr (V == 8)
                *reinterpret_cast<uint2*>(orow + i * V) = *reinterpret_cast<const uint2*>(c);
            else
#pragma unroll
                for (int e = 0; e < V; ++e) orow[i * V + e] = c[e];
        }
    } else {
        if (!valid) return;
        auto second_pass = [&](int i, const float(&v)[V]) {
            float w[V], o[V];
            load_n<V>(weight + i * V, w);
#pragma unroll
            for (int e = 0; e < V; ++e) o[e] = w[e] * (v[e] * inv);
            store_n<V>(orow + i * V, o);
        };
        if constexpr (NV > 0) {
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int i = lane + j * tpr;
                if (i < nvec) second_pass(i, cache[j]);
            }
        } else {
            for (int i = lane; i < nvec; i += tpr) {
                float v[V];
                if constexpr (RES)
                    load_n<V>(rr + i * V, v);
                else
                    load_n<V>(xr + i * V, v);
                second_pass(i, v);
            }
        }
    }
}

template <typename XT, typename OT, bool RES, int V>
void launch_rms_norm_v(const void* x, float* residual, const float* weight, float eps, void* out, int rows, int dim,
                       cudaStream_t stream, float* qscale) {
    const XT* xp = static_cast<const XT*>(x);
    OT* op = static_cast<OT*>(out);
    const int nvec = dim / V;
    if (nvec <= 128) {
        // Small rows (qk-norm heads, tiny models): a power-of-two group of <= 32 lanes per row.
        int tpr = 1;
        while (tpr < 32 && tpr * 4 < nvec) tpr *= 2;  // each lane handles up to 4 vectors
        tpr = std::max(tpr, 4);
        const int per_lane = static_cast<int>(ceil_div(nvec, tpr));
        const int threads = 128, rows_per_cta = threads / tpr;
        const unsigned grid = static_cast<unsigned>(ceil_div(rows, rows_per_cta));
        if (per_lane <= 1)
            launch_pdl(rms_norm_kernel<XT, OT, RES, V, 1>, grid, threads, 0, stream, xp, residual, weight, eps, op,
                       rows, dim, tpr, qscale);
        else if (per_lane <= 2)
            launch_pdl(rms_norm_kernel<XT, OT, RES, V, 2>, grid, threads, 0, stream, xp, residual, weight, eps, op,
                       rows, dim, tpr, qscale);
        else
            launch_pdl(rms_norm_kernel<XT, OT, RES, V, 4>, grid, threads, 0, stream, xp, residual, weight, eps, op,
                       rows, dim, tpr, qscale);
        return;
    }
    // One CTA per row, about 256 threads, the row cached in registers up to 4 vectors a thread.
    const unsigned grid = static_cast<unsigned>(rows);
    if (nvec <= 256) {
        launch_pdl(rms_norm_kernel<XT, OT, RES, V, 1>, grid, round_up(nvec, 32), 0, stream, xp, residual, weight, eps,
                   op, rows, dim, round_up(nvec, 32), qscale);
    } else if (nvec <= 512) {
        const int t = round_up(static_cast<int>(ceil_div(nvec, 2)), 32);
        launch_pdl(rms_norm_kernel<XT, OT, RES, V, 2>, grid, t, 0, stream, xp, residual, weight, eps, op, rows, dim, t,
                   qscale);
    } else if (nvec <= 4096) {
        const int t = round_up(static_cast<int>(ceil_div(nvec, 4)), 32);
        launch_pdl(rms_norm_kernel<XT, OT, RES, V, 4>, grid, t, 0, stream, xp, residual, weight, eps, op, rows, dim, t,
                   qscale);
    } else if constexpr (!std::is_same_v<OT, uint8_t>) {  // e4m3 output: rms_norm_e4m3 refuses such rows
        launch_pdl(rms_norm_kernel<XT, OT, RES, V, 0>, grid, 1024, 0, stream, xp, residual, weight, eps, op, rows, dim,
                   1024, qscale);
    }
}

template <typename XT, typename OT, bool RES>
void launch_rms_norm(const void* x, float* residual, const float* weight, float eps, void* out, int rows, int dim,
                     cudaStream_t stream, float* qscale = nullptr) {
    const bool vec = dim % 8 == 0 && aligned16(x) && aligned16(out) && aligned16(weight) &&
                     (residual == nullptr || aligned16(residual));
    if (vec)
        launch_rms_norm_v<XT, OT, RES, 8>(x, residual, weight, eps, out, rows, dim, stream, qscale);
    else
        launch_rms_norm_v<XT, OT, RES, 1>(x, residual, weight, eps, out, rows, dim, stream, qscale);
}

template <typename XT, typename OT>
void launch_rms_norm_res(const void* x, float* residual, const float* weight, float eps, void* out, int rows, int dim,
                         cudaStream_t stream, float* qscale = nullptr) {
    if (residual)
        launch_rms_norm<XT, OT, true>(x, residual, weight, eps, out, rows, dim, stream, qscale);
    else
        launch_rms_norm<XT, OT, false>(x, residual, weight, eps, out, rows, dim, stream, qscale);
}

// ---- rope + cache --------------------------------------------------------------------------

// One CTA per token. cos/sin of the token's angles go to shared memory first ([half] each),
// then each thread rotates P pairs of one head (q heads, then k heads; k pairs also go to the
// cache), then the unrotated k dims and all of v are copied to the cache W values at a time.
// F8 (k_cache / v_cache unused, k8 / v8 the FP8 caches of geometry g8): no bf16 cache writes;
// once k is rotated in place, one warp per (kv head, K or V) quantizes the head into the slot.
template <int P, bool NEOX, int W, bool F8>
__global__ void rope_cache_kernel(uint16_t* __restrict__ q, uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                                  const int32_t* __restrict__ positions, const int32_t* __restrict__ slot_mapping,
                                  const float* __restrict__ inv_freq, int rotary_dim, float attention_factor,
                                  int num_heads, int num_kv_heads, int head_dim, uint16_t* __restrict__ k_cache,
                                  uint16_t* __restrict__ v_cache, uint8_t* __restrict__ k8, uint8_t* __restrict__ v8,
                                  const kvf8::Geometry g8) {
    extern __shared__ float cs[];  // [2 * half]: cos then sin
    const int64_t t = blockIdx.x;
    const int half = rotary_dim / 2;
    const float pos = static_cast<float>(positions[t]);
    pdl_launch_dependents();
    // Positions and inv_freq were written before the step: the angles need no earlier kernel.
    rope_angles(cs, pos, inv_freq, half, attention_factor);
    __syncthreads();
    pdl_wait();

    const int64_t kv_dim = static_cast<int64_t>(num_kv_heads) * head_dim;
    const int64_t slot = slot_mapping[t];
    uint16_t* q_row = q + t * num_heads * head_dim;
    uint16_t* k_row = k + t * kv_dim;
    const int chunks = half / P;  // P-pair chunks per head
    const int items = (num_heads + num_kv_heads) * chunks;
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
        const int h = it / chunks;
        const int i0 = (it % chunks) * P;
        const bool is_k = h >= num_heads;
        uint16_t* head = is_k ? k_row + static_cast<int64_t>(h - num_heads) * head_dim : q_row + h * head_dim;
        uint16_t* cached = !F8 && is_k && slot >= 0
                               ? k_cache + slot * kv_dim + static_cast<int64_t>(h - num_heads) * head_dim
                               : nullptr;
        if constexpr (NEOX) {  // pairs (i, i + half)
            float a[P], b[P];
            load_n<P>(head + i0, a);
            load_n<P>(head + i0 + half, b);
#pragma unroll
            for (int j = 0; j < P; ++j) {
                const float c = cs[i0 + j], s = cs[half + i0 + j];
                const float x0 = a[j], x1 = b[j];
                a[j] = rope_rotate(x0, x1, c, s, true);
                b[j] = rope_rotate(x1, x0, c, s, false);
            }
            store_n<P>(head + i0, a);
            store_n<P>(head + i0 + half, b);
            if (cached) {
                store_n<P>(cached + i0, a);
                store_n<P>(cached + i0 + half, b);
            }
        } else {  // pairs (2i, 2i + 1)
            float a[2 * P];
            load_n<2 * P>(head + 2 * i0, a);
#pragma unroll
            for (int j = 0; j < P; ++j) {
                const float c = cs[i0 + j], s = cs[half + i0 + j];
                const float x0 = a[2 * j], x1 = a[2 * j + 1];
                a[2 * j] = rope_rotate(x0, x1, c, s, true);
                a[2 * j + 1] = rope_rotate(x1, x0, c, s, false);
            }
            store_n<2 * P>(head + 2 * i0, a);
            if (cached) store_n<2 * P>(cached + 2 * i0, a);
        }
    }

    if (slot < 0) return;  // a padding token: rotated, but no cache write (uniform over the CTA)
    if constexpr (F8) {
        __syncthreads();  // every rotated k element, written to k_row above, is visible to the CTA
        kvf8::quantize_token(k_row, v + t * kv_dim, num_kv_heads, head_dim, k8, v8, g8, slot);
        return;
    }
    uint16_t* kc = k_cache + slot * kv_dim;
    uint16_t* vc = v_cache + slot * kv_dim;
    const uint16_t* v_row = v + t * kv_dim;
    for (int64_t e = static_cast<int64_t>(threadIdx.x) * W; e < kv_dim; e += static_cast<int64_t>(blockDim.x) * W) {
        if (e % head_dim >= rotary_dim) copy_n<W>(kc + e, k_row + e);  // W divides rotary_dim and head_dim
        copy_n<W>(vc + e, v_row + e);
    }
}

template <int P, bool NEOX>
void launch_rope_p(bool vec_copy, dim3 grid, int threads, size_t smem, cudaStream_t stream, uint16_t* q, uint16_t* k,
                   const uint16_t* v, const DeviceBatch& b, const float* inv_freq, int rotary_dim, float af, int nh,
                   int nkv, int hd, uint16_t* kc, uint16_t* vc, uint8_t* k8, uint8_t* v8, const kvf8::Geometry& g8) {
    if (k8 != nullptr)  // FP8: no bf16 copies at all
        launch_pdl(rope_cache_kernel<P, NEOX, 1, true>, grid, threads, smem, stream, q, k, v, b.positions,
                   b.slot_mapping, inv_freq, rotary_dim, af, nh, nkv, hd, kc, vc, k8, v8, g8);
    else if (vec_copy)
        launch_pdl(rope_cache_kernel<P, NEOX, 8, false>, grid, threads, smem, stream, q, k, v, b.positions,
                   b.slot_mapping, inv_freq, rotary_dim, af, nh, nkv, hd, kc, vc, k8, v8, g8);
    else
        launch_pdl(rope_cache_kernel<P, NEOX, 1, false>, grid, threads, smem, stream, q, k, v, b.positions,
                   b.slot_mapping, inv_freq, rotary_dim, af, nh, nkv, hd, kc, vc, k8, v8, g8);
}

// ---- silu_mul, gather, copy_blocks, add_bias, fill ------------------------------------------

template <int V>
__global__ void silu_mul_kernel(const uint16_t* gate, const uint16_t* __restrict__ up, uint16_t* out, int64_t nvec) {
    pdl_launch_dependents();
    pdl_wait();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nvec;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float g[V], u[V];
        load_n<V>(gate + i * V, g);
        load_n<V>(up + i * V, u);
#pragma unroll
        for (int e = 0; e < V; ++e) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
        store_n<V>(out + i * V, g);
    }
}

// out[i, :] = x[rows[i], :]; one CTA per output row; a negative row gives zeros.
template <int V>
__global__ void gather_rows_kernel(const uint16_t* __restrict__ x, const int32_t* __restrict__ rows, int dim,
                                   uint16_t* __restrict__ out) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t i = blockIdx.x;
    const int32_t r = rows[i];
    uint16_t* dst = out + i * dim;
    for (int c = threadIdx.x * V; c < dim; c += blockDim.x * V) {
        if (r >= 0) {
            copy_n<V>(dst + c, x + static_cast<int64_t>(r) * dim + c);
        } else {
#pragma unroll
            for (int j = 0; j < V; ++j) dst[c + j] = 0;
        }
    }
}

// grid: (pair, chunk of the block). Pairs with a negative or equal src/dst are skipped.
template <int V>
__global__ void copy_blocks_kernel(uint16_t* cache, const int32_t* __restrict__ pairs, int64_t block_elems) {
    const int32_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
    if (src < 0 || dst < 0 || src == dst) return;
    const uint16_t* s = cache + static_cast<int64_t>(src) * block_elems;
    uint16_t* d = cache + static_cast<int64_t>(dst) * block_elems;
    const int64_t nvec = block_elems / V;
    for (int64_t i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nvec;
         i += static_cast<int64_t>(gridDim.y) * blockDim.x)
        copy_n<V>(d + i * V, s + i * V);
}

// x[i, :] += bias; x: [n, m] bf16 seen as n*m/V vectors (V divides m).
template <int V>
__global__ void add_bias_kernel(uint16_t* __restrict__ x, const float* __restrict__ bias, int64_t m, int64_t nvec) {
    pdl_launch_dependents();
    pdl_wait();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nvec;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t col = (i * V) % m;
        float a[V], b[V];
        load_n<V>(x + i * V, a);
        load_n<V>(bias + col, b);
#pragma unroll
        for (int e = 0; e < V; ++e) a[e] += b[e];
        store_n<V>(x + i * V, a);
    }
}

// out += x, f32 seen as nvec vectors of V.
template <int V>
__global__ void add_f32_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t nvec) {
    pdl_launch_dependents();
    pdl_wait();
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nvec;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float a[V], b[V];
        load_n<V>(out + i * V, a);
        load_n<V>(x + i * V, b);
#pragma unroll
        for (int e = 0; e < V; ++e) a[e] += b[e];
        store_n<V>(out + i * V, a);
    }
}

// The CPU backend's uniform_hash (backend.cc), bit for bit: splitmix64 of (seed, index), 24
// bits, then lo + (hi - lo) * u with separately rounded f32 operations (no FMA), so dummy
// weights on the GPU equal the CPU backend's.
__device__ __forceinline__ uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
__device__ __forceinline__ float uniform_at(uint64_t seed, uint64_t index, float lo, float hi) {
    const uint64_t h = splitmix(seed ^ splitmix(index));
    const float u = __fmul_rn(static_cast<float>(h >> 40), 1.0f / 16777216.0f);
    return __fadd_rn(lo, __fmul_rn(__fsub_rn(hi, lo), u));
}

template <typename T>
__global__ void fill_random_kernel(T* out, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = uniform_at(seed, static_cast<uint64_t>(i), lo, hi);
        if constexpr (sizeof(T) == 2)
            out[i] = f2bf(v);
        else
            out[i] = v;
    }
}

}  // namespace

// ---- launchers -------------------------------------------------------------------------------

void embedding(const bf16_t* table, const int32_t* ids, const int32_t* feed, int n, int hidden, int vocab_begin,
               int vocab_rows, float* out, cudaStream_t stream) {
    if (n <= 0 || hidden <= 0) return;
    const bool vec = hidden % 8 == 0 && aligned16(table) && aligned16(out);
    const int v = vec ? 8 : 1;
    const int threads = std::clamp(round_up(hidden / v, 32), 32, 256);
    if (vec)
        launch_pdl(embedding_kernel<8>, n, threads, 0, stream, table, ids, feed, hidden, vocab_begin, vocab_rows, out);
    else
        launch_pdl(embedding_kernel<1>, n, threads, 0, stream, table, ids, feed, hidden, vocab_begin, vocab_rows, out);
    check_launch("embedding");
}

void rms_norm(const void* x, bool x_f32, float* residual, const float* weight, float eps, void* out, bool out_f32,
              int rows, int dim, cudaStream_t stream) {
    if (rows <= 0 || dim <= 0) return;
    if (x_f32) {
        if (out_f32)
            launch_rms_norm_res<float, float>(x, residual, weight, eps, out, rows, dim, stream);
        else
            launch_rms_norm_res<float, uint16_t>(x, residual, weight, eps, out, rows, dim, stream);
    } else {
        if (out_f32)
            launch_rms_norm_res<uint16_t, float>(x, residual, weight, eps, out, rows, dim, stream);
        else
            launch_rms_norm_res<uint16_t, uint16_t>(x, residual, weight, eps, out, rows, dim, stream);
    }
    check_launch("rms_norm");
}

bool rms_norm_e4m3(const void* x, bool x_f32, float* residual, const float* weight, float eps, uint8_t* codes,
                   float* scale, int rows, int dim, cudaStream_t stream) {
    // The 16-byte path with the row in registers (launch_rms_norm's choice for these operands).
    if (dim % 8 != 0 || dim / 8 > 4096 || !aligned16(x) || !aligned16(codes) || !aligned16(weight) ||
        (residual != nullptr && !aligned16(residual)))
        return false;
    if (rows <= 0) return true;
    if (x_f32)
        launch_rms_norm_res<float, uint8_t>(x, residual, weight, eps, codes, rows, dim, stream, scale);
    else
        launch_rms_norm_res<uint16_t, uint8_t>(x, residual, weight, eps, codes, rows, dim, stream, scale);
    check_launch("rms_norm_e4m3");
    return true;
}

namespace {
// rope_and_cache into bf16 caches (k_cache / v_cache) or FP8 ones (k8 / v8 non-null).
void rope_and_cache_into(bf16_t* q, bf16_t* k, const bf16_t* v, const DeviceBatch& batch, const float* inv_freq,
                         int rotary_dim, float attention_factor, bool neox, int num_heads, int num_kv_heads,
                         int head_dim, bf16_t* k_cache, bf16_t* v_cache, uint8_t* k8, uint8_t* v8,
                         cudaStream_t stream) {
    const int n = batch.num_tokens;
    if (n <= 0) return;
    const kvf8::Geometry g8 = k8 != nullptr
                                  ? kvf8::checked_geometry(batch.block_size, num_kv_heads, head_dim, "rope_and_cache")
                                  : kvf8::Geometry{};
    if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim || head_dim % 2 != 0)
        fail("rope_and_cache: rotary_dim ", rotary_dim, " and head_dim ", head_dim,
             " must be even, rotary_dim at most head_dim");
    const int half = rotary_dim / 2;
    // Pairs per thread: the widest access that divides the rotated span and keeps alignment.
    // neox reads P values at i and at i + half; interleaved reads 2P values at 2i.
    auto ptrs_aligned = [&](size_t bytes) {
        return aligned_to(q, bytes) && aligned_to(k, bytes) && aligned_to(k_cache, bytes);
    };
    if (!ptrs_aligned(4)) fail("rope_and_cache: q, k and k_cache must be 4-byte aligned");
    int p = 1;
    if (neox) {
        if (ptrs_aligned(16) && half % 8 == 0 && head_dim % 8 == 0)
            p = 8;
        else if (ptrs_aligned(8) && half % 4 == 0 && head_dim % 4 == 0)
            p = 4;
        else if (half % 2 == 0)
            p = 2;
    } else {
        if (ptrs_aligned(16) && half % 4 == 0 && head_dim % 8 == 0)
            p = 4;
        else if (ptrs_aligned(8) && half % 2 == 0 && head_dim % 4 == 0)
            p = 2;
    }
    const bool vec_copy = k8 == nullptr && head_dim % 8 == 0 && rotary_dim % 8 == 0 && aligned16(k) && aligned16(v) &&
                          aligned16(k_cache) && aligned16(v_cache);
    const int items = (num_heads + num_kv_heads) * (half > 0 ? half / p : 0);
    const int copies = num_kv_heads * head_dim / (vec_copy ? 8 : 1);
    const int threads = std::clamp(round_up(std::max(items, copies), 32), 32, 256);
    const size_t smem = sizeof(float) * 2 * std::max(half, 1);
    const dim3 grid(static_cast<unsigned>(n));
    auto go = [&](auto p_const) {
        constexpr int P = decltype(p_const)::value;
        if (neox)
            launch_rope_p<P, true>(vec_copy, grid, threads, smem, stream, q, k, v, batch, inv_freq, rotary_dim,
                                   attention_factor, num_heads, num_kv_heads, head_dim, k_cache, v_cache, k8, v8, g8);
        else
            launch_rope_p<P, false>(vec_copy, grid, threads, smem, stream, q, k, v, batch, inv_freq, rotary_dim,
                                    attention_factor, num_heads, num_kv_heads, head_dim, k_cache, v_cache, k8, v8, g8);
    };
    switch (p) {
        case 8:
            go(std::integral_constant<int, 8>{});
            break;
        case 4:
            go(std::integral_constant<int, 4>{});
            break;
        case 2:
            go(std::integral_constant<int, 2>{});
            break;
        default:
            go(std::integral_constant<int, 1>{});
            break;
    }
    check_launch("rope_and_cache");
}
}  // namespace

void rope_and_cache(bf16_t* q, bf16_t* k, const bf16_t* v, const DeviceBatch& batch, const float* inv_freq,
                    int rotary_dim, float attention_factor, bool neox, int num_heads, int num_kv_heads, int head_dim,
                    bf16_t* k_cache, bf16_t* v_cache, cudaStream_t stream) {
    rope_and_cache_into(q, k, v, batch, inv_freq, rotary_dim, attention_factor, neox, num_heads, num_kv_heads, head_dim,
                        k_cache, v_cache, nullptr, nullptr, stream);
}

void rope_and_cache_fp8(bf16_t* q, bf16_t* k, const bf16_t* v, const DeviceBatch& batch, const float* inv_freq,
                        int rotary_dim, float attention_factor, bool neox, int num_heads, int num_kv_heads,
                        int head_dim, uint8_t* k_cache, uint8_t* v_cache, cudaStream_t stream) {
    if (k_cache == nullptr || v_cache == nullptr) fail("rope_and_cache_fp8: null cache");
    rope_and_cache_into(q, k, v, batch, inv_freq, rotary_dim, attention_factor, neox, num_heads, num_kv_heads, head_dim,
                        nullptr, nullptr, k_cache, v_cache, stream);
}

void silu_mul(const bf16_t* gate, const bf16_t* up, bf16_t* out, int64_t n, int64_t dim, cudaStream_t stream) {
    const int64_t total = n * dim;
    if (total <= 0) return;
    const int threads = 256;
    if (total % 8 == 0 && aligned16(gate) && aligned16(up) && aligned16(out))
        launch_pdl(silu_mul_kernel<8>, grid_for(total / 8, threads), threads, 0, stream, gate, up, out, total / 8);
    else
        launch_pdl(silu_mul_kernel<1>, grid_for(total, threads), threads, 0, stream, gate, up, out, total);
    check_launch("silu_mul");
}

void gather_rows(const bf16_t* x, const int32_t* rows, int n, int dim, bf16_t* out, cudaStream_t stream) {
    if (n <= 0 || dim <= 0) return;
    const bool vec = dim % 8 == 0 && aligned16(x) && aligned16(out);
    const int threads = std::clamp(round_up(vec ? dim / 8 : dim, 32), 32, 256);
    if (vec)
        launch_pdl(gather_rows_kernel<8>, n, threads, 0, stream, x, rows, dim, out);
    else
        launch_pdl(gather_rows_kernel<1>, n, threads, 0, stream, x, rows, dim, out);
    check_launch("gather_rows");
}

void copy_blocks(bf16_t* cache, const int32_t* pairs, int n_pairs, int64_t block_elems, cudaStream_t stream) {
    if (n_pairs <= 0 || block_elems <= 0) return;
    const int threads = 256;
    const bool vec = block_elems % 8 == 0 && aligned16(cache);
    const int64_t nvec = vec ? block_elems / 8 : block_elems;
    const dim3 grid(static_cast<unsigned>(n_pairs),
                    static_cast<unsigned>(std::clamp<int64_t>(ceil_div(nvec, threads * 4), 1, 65535)));
    if (vec)
        copy_blocks_kernel<8><<<grid, threads, 0, stream>>>(cache, pairs, block_elems);
    else
        copy_blocks_kernel<1><<<grid, threads, 0, stream>>>(cache, pairs, block_elems);
    check_launch("copy_blocks");
}

void fill_random_bf16(bf16_t* out, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
    if (n <= 0) return;
    fill_random_kernel<uint16_t><<<grid_for(n, 256), 256, 0, stream>>>(out, n, seed, -scale, scale);
    check_launch("fill_random_bf16");
}

void fill_random_f32(float* out, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
    if (n <= 0) return;
    fill_random_kernel<float><<<grid_for(n, 256), 256, 0, stream>>>(out, n, seed, lo, hi);
    check_launch("fill_random_f32");
}

void add_bias(bf16_t* x, const float* bias, int64_t n, int64_t m, cudaStream_t stream) {
    const int64_t total = n * m;
    if (total <= 0) return;
    const int threads = 256;
    if (m % 8 == 0 && aligned16(x) && aligned16(bias))
        launch_pdl(add_bias_kernel<8>, grid_for(total / 8, threads), threads, 0, stream, x, bias, m, total / 8);
    else
        launch_pdl(add_bias_kernel<1>, grid_for(total, threads), threads, 0, stream, x, bias, m, total);
    check_launch("add_bias");
}

void add_f32(const float* x, float* out, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    const int threads = 256;
    if (n % 4 == 0 && aligned16(x) && aligned16(out))
        launch_pdl(add_f32_kernel<4>, grid_for(n / 4, threads), threads, 0, stream, x, out, n / 4);
    else
        launch_pdl(add_f32_kernel<1>, grid_for(n, threads), threads, 0, stream, x, out, n);
    check_launch("add_f32");
}

}  // namespace peregrine::cuda
