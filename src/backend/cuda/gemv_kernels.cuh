// The decode products' kernels (gemv.cu: bf16 and FP8 weights; gemv_gguf.cu: the GGUF
// layouts), included by both; each instantiates the kernels of its own weight kinds.
// Skinny products for decode: out[n, m] = x[n, k] . w[m, k]^T with n <= 4, bf16 in, f32
// accumulate. Memory-bound: every weight byte is read once, 16 bytes per lane per load with
// several loads in flight; the few x rows are read through L1/L2 (k <= 16K elements each).
// Epilogues remove the small kernels around a decode product:
// - silu: after the gate | up product a CTA takes rows i and m/2 + i and writes silu(gate_i) * up_i;
// - add: out (the f32 residual stream) += the product, the residual add of the o / down products;
// - norm (a prologue, with plain or silu): x is the f32 residual stream and the product is that
//   of rms_norm(x) * norm. Every CTA reads all of x anyway, so it sums x^2 in the same pass and
//   scales its dot products by 1 / sqrt(mean(x^2) + eps) at the end: no normalised copy of x.
// (A residual-add + RMSNorm epilogue done by the last CTA to finish was tried and cost 10-20% of
// decode speed on an H100: not kept.)
// Weight kinds (template W, GemvWeight::Kind): bf16; FP8 E4M3 with one f32 factor per row (a
// thread's 16-byte chunk holds 16 values, two 8-element pieces of x, each row's sum scaled by its
// factor at the end); the GGUF device layouts of core/gpu_quant.h (a chunk of 16 int8 or 32
// 4-bit codes plus its block's f16 factor, applied per value as it is unpacked). A 16-byte chunk
// in every kind, so a configuration's chunks in flight are the same bytes (measured for bf16;
// FP8 and int8 codes take half as many, 4-bit codes a quarter: see launch; the GGUF layouts are
// not tuned, issue #23's figures in docs/PERFORMANCE.md).
// Two kernels: gemv_kernel, one CTA per row block (thousands of short CTAs), and at n = 1 for
// some bf16 / FP8 products gemv_persistent_kernel, one CTA per resident slot walking a range of
// row blocks with x staged once in shared memory (launch_persistent_by_k says which, with the
// numbers). FP8 products (and the bf16 ones gemv_mma.cu's bf16_auto names) go first to the
// tensor-core kernel of gemv_mma.cu, which takes every one whose x it can stage; these kernels
// run the rest.
// CUDA-only: include from .cu files (the kernels have internal linkage).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/persistent_products.cuh"
#include "backend/cuda/weight_chunks.cuh"
#include "core/env.h"

namespace peregrine::cuda {

// Test hooks, one copy for both files: set_gemv_config's rows per CTA and chunks in flight (2x1,
// 2x2, 2x4, 1x4, 1x8) of gemv_kernel, which then takes every product (0 = by k), and
// set_gguf_gemv_persistent's mode (-1 = PEREGRINE_GGUF_GEMV decides).
namespace gemv_hooks {
inline int g_rows = 0, g_depth = 0;
inline int g_gguf_persistent = -1;
}  // namespace gemv_hooks

// The GGUF layouts' products of n rows (to 8, in slices of kMaxGemvRows), EPI an Epilogue below
// (gemv_gguf.cu instantiates the five the entry points of gemv.cu hand over after checking the
// arguments).
template <int EPI, bool NORM>
void gguf_gemv_rows(const void* x, const float* norm, float eps, GemvWeight w, void* out, bool out_f32, int n, int m,
                    int k, cudaStream_t stream);

namespace {

constexpr int kWarps = 4;  // warps per CTA; k is interleaved over all the CTA's threads
constexpr int kThreads = kWarps * 32;

using gemv_hooks::g_depth;
using gemv_hooks::g_gguf_persistent;
using gemv_hooks::g_rows;
bool gguf_persistent() {
    if (g_gguf_persistent >= 0) return g_gguf_persistent == 1;
    static const bool env = !env_equals("PEREGRINE_GGUF_GEMV", "blocks");
    return env;
}

enum Epilogue { kPlain, kSilu, kAdd };
static_assert(static_cast<int>(kPlain) == MmaProduct::kPlain && static_cast<int>(kSilu) == MmaProduct::kSilu &&
              static_cast<int>(kAdd) == MmaProduct::kAdd);

// The factor a row's sum is scaled by: e4m3's per-row factor, else 1.
template <int W>
__device__ __forceinline__ float row_factor(const Args& a, int row) {
    if constexpr (W == kF8) return __ldg(a.w_scale + row);
    return 1.0f;
}

// A normed product's 8-value piece c of token j (weight_chunks.cuh).
__device__ __forceinline__ void load_normed_chunk(const Args& a, int j, int c, float (&v)[8], float (&g)[8]) {
    load_normed_piece(static_cast<const float*>(a.x), a.norm, a.k, j, c, v, g);
}

// The 4-bit products (kU4) multiply on integers, as llama.cpp's decode products do: x is taken
// in blocks of 32 (one chunk's span) quantized to int8, q = rint(x * 127 / amax), d = amax / 127,
// s = d * sum(q) (all zero when amax is 0); a chunk's sum is then
// scale * d * dot(codes, q) - min * s, with dot on dp4a (4 products an instruction). Words e[i]
// hold q of elements 8i + {0, 2, 4, 6} (a byte each), o[i] of 8i + {1, 3, 5, 7}: the order of
// the chunk's low and high nibbles. Both kernels quantize with the same steps (bitwise equal x).
struct XBlock {
    uint32_t e[4], o[4];
    float d, s;
};
__device__ __forceinline__ XBlock quantize_x_block(const float (&x)[32]) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
    XBlock b;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t e = 0, o = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int qe = __float2int_rn(x[8 * i + 2 * t] * id), qo = __float2int_rn(x[8 * i + 2 * t + 1] * id);
            sum += qe + qo;
            e |= (static_cast<uint32_t>(qe) & 0xffu) << (8 * t);
            o |= (static_cast<uint32_t>(qo) & 0xffu) << (8 * t);
        }
        b.e[i] = e, b.o[i] = o;
    }
    b.d = amax / 127.0f;
    b.s = b.d * static_cast<float>(sum);
    return b;
}
// Token j's 32 values of x at chunk c (NORM: x * norm, adding x^2 to ss in element order).
template <bool NORM>
__device__ __forceinline__ void load_x_block(const Args& a, int j, int c, float (&x)[32], float& ss) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        if constexpr (NORM) {
            float v[8], g[8];
            load_normed_chunk(a, j, 4 * c + p, v, g);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                ss = fmaf(v[e], v[e], ss);
                x[8 * p + e] = v[e] * g[e];
            }
        } else {
            float f[8];
            unpack8(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) +
                                                   static_cast<int64_t>(j) * a.k)[4 * c + p],
                    f);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[8 * p + e] = f[e];
        }
    }
}
// A 4-bit chunk (32 codes, its (scale, min) pair) times a quantized x block.
__device__ __forceinline__ float u4_dot(const QuantChunk& w, const XBlock& x) {
    const uint32_t q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
    int dot = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        dot = __dp4a(static_cast<int>(q[i] & 0x0F0F0F0Fu), static_cast<int>(x.e[i]), dot);
        dot = __dp4a(static_cast<int>((q[i] >> 4) & 0x0F0F0F0Fu), static_cast<int>(x.o[i]), dot);
    }
    const float scale = f16_bits(w.f & 0xffffu), min = f16_bits(w.f >> 16);
    return fmaf(scale * x.d, static_cast<float>(dot), -(min * x.s));
}
// A GQ6_32 chunk times a quantized x block: per half, scale * d * (dot(q, xq) - 32 * sum(xq)),
// the sums of xq by dp4a with ones (XBlock stays as the 4-bit products read it).
__device__ __forceinline__ float u6_dot(const Q6Chunk& w, const XBlock& x) {
    int dot[2] = {0, 0}, sum[2] = {0, 0};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const int e = static_cast<int>(x.e[p]), o = static_cast<int>(x.o[p]);
        dot[p / 2] = __dp4a(static_cast<int>(WeightChunk<kU6>::codes4(w, p, 0)), e, dot[p / 2]);
        dot[p / 2] = __dp4a(static_cast<int>(WeightChunk<kU6>::codes4(w, p, 1)), o, dot[p / 2]);
        sum[p / 2] = __dp4a(0x01010101, e, __dp4a(0x01010101, o, sum[p / 2]));
    }
    const float s0 = f16_bits(w.f & 0xffffu), s1 = f16_bits(w.f >> 16);
    return fmaf(s0 * x.d, static_cast<float>(dot[0] - 32 * sum[0]),
                (s1 * x.d) * static_cast<float>(dot[1] - 32 * sum[1]));
}
template <int W, typename Chunk>
__device__ __forceinline__ float int_x_dot(const Chunk& w, const XBlock& x) {
    if constexpr (W == kU6)
        return u6_dot(w, x);
    else
        return u4_dot(w, x);
}

// acc[r][j] += weight rows r's piece p (of their chunks cur[r]) . token j's 8 values xf: the
// inner step both kernels share for the bf16, FP8 and int8 layouts.
template <int W, int R, int N, typename Chunk>
__device__ __forceinline__ void fma_piece(const Chunk (&cur)[R], int p, const float (&xf)[8], float (&acc)[R][N],
                                          int j) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float wf[8];
        WeightChunk<W>::unpack(cur[r], p, wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(wf[e], xf[e], acc[r][j]);
    }
}

// Normed products whose chunks hold more than one 8-element piece of x (FP8, the int8 layouts) sum
// x^2 a piece at a time, each piece from 0, then add the pieces in each thread's chunk order (both
// kernels, so they give the same bits; the persistent kernel stages x a piece a thread and keeps
// the pieces' sums in shared memory after x). Others add x^2 as one chain over a thread's chunks.
template <int W, bool NORM>
constexpr bool kPieceSums = NORM&& WeightChunk<W>::kPieces > 1 && !kIntX<W>;

// One CTA per R output rows (silu: R == 2, rows i and m/2 + i). Each thread takes 16-byte
// chunks c = threadIdx.x + 128 j of every row and keeps D chunks per row in flight (a group),
// loading the next group while it multiplies the current one; the four warps' partial sums
// are added in a fixed order at the end.
template <int N, int R, int D, int EPI, bool NORM, int W>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const Args a) {
    static_assert(EPI != kSilu || R == 2, "silu pairs a gate row with its up row");
    using WC = WeightChunk<W>;
    using Chunk = typename WC::Chunk;
    constexpr int P = WC::kPieces;
    const int m = a.m, k = a.k;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    auto row_of = [&](int r) {
        return EPI == kSilu ? static_cast<int>(blockIdx.x) + r * (m / 2) : static_cast<int>(blockIdx.x) * R + r;
    };
    float acc[R][N] = {};
    float ss[N] = {};                // NORM: sum of x^2 per token over this thread's chunks
    const int chunks = k / (8 * P);  // 16-byte weight chunks per row
    auto load_group = [&](int base, Chunk(&g)[D][R]) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = base + d * kThreads;
#pragma unroll
            for (int r = 0; r < R; ++r) g[d][r] = row_of(r) < m && c < chunks ? WC::load(a, row_of(r), c) : Chunk{};
        }
    };
    // Under programmatic launch this runs while the previous kernel finishes: the first weight
    // group goes to registers and the rest of this CTA's rows towards L2 (weights are constant
    // during a step), then wait for x.
    pdl_launch_dependents();
    Chunk next[D][R];
    load_group(threadIdx.x, next);
    const int lines = static_cast<int>((WC::row_bytes(k) + 127) / 128);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (row_of(r) >= m) break;
        const char* row = static_cast<const char*>(a.w) + static_cast<int64_t>(row_of(r)) * WC::row_bytes(k);
        for (int i = threadIdx.x; i < lines; i += kThreads)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(row + static_cast<int64_t>(i) * 128));
    }
    pdl_wait();
    // add: the residual value this thread adds to (thread t < R * N: row t % R, token t / R),
    // read now so its latency overlaps the weights' instead of ending the CTA.
    float resid = 0.0f;
    if constexpr (EPI == kAdd) {
        const int r = threadIdx.x % R, j = threadIdx.x / R;
        if (threadIdx.x < R * N && row_of(r) < m)
            resid = static_cast<const float*>(a.out)[static_cast<int64_t>(j) * m + row_of(r)];
    }
    for (int base = threadIdx.x; base < chunks; base += D * kThreads) {
        Chunk cur[D][R];
#pragma unroll
        for (int d = 0; d < D; ++d)
#pragma unroll
            for (int r = 0; r < R; ++r) cur[d][r] = next[d][r];
        load_group(base + D * kThreads, next);
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = base + d * kThreads;
            if (c >= chunks) break;
            if constexpr (kIntX<W>) {  // x quantized a block at a time (XBlock)
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    float xf[32];
                    load_x_block<NORM>(a, j, c, xf, ss[j]);
                    const XBlock xb = quantize_x_block(xf);
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r][j] += int_x_dot<W>(cur[d][r], xb);
                }
            }
#pragma unroll
            for (int p = 0; !kIntX<W> && p < P; ++p) {
                const int x8 = c * P + p;  // the 8-element piece of x
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    float xf[8];  // x loads are plain: x was written by the kernel just before
                    if constexpr (NORM) {
                        float v[8], g[8];  // x^2 by kPieceSums
                        load_normed_chunk(a, j, x8, v, g);
                        float s = kPieceSums<W, NORM> ? 0.0f : ss[j];
#pragma unroll
                        for (int e = 0; e < 8; ++e) {
                            s = fmaf(v[e], v[e], s);
                            xf[e] = v[e] * g[e];
                        }
                        ss[j] = kPieceSums<W, NORM> ? ss[j] + s : s;
                    } else {
                        unpack8(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) +
                                                               static_cast<int64_t>(j) * k)[x8],
                                xf);
                    }
                    fma_piece<W>(cur[d], p, xf, acc, j);
                }
            }
        }
    }
    __shared__ float part[kWarps][R + NORM][N];  // NORM: row R holds the x^2 sums
#pragma unroll
    for (int r = 0; r < R + NORM; ++r) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float v = r < R ? acc[r][j] : ss[j];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) part[warp][r][j] = v;
        }
    }
    __syncthreads();
    auto sum = [&](int r, int j) {
        float v = 0;
#pragma unroll
        for (int q = 0; q < kWarps; ++q) v += part[q][r][j];
        return v;
    };
    auto total = [&](int r, int j) {  // the output value of row r, token j
        const float v = sum(r, j) * row_factor<W>(a, row_of(r));
        if constexpr (NORM) return v / sqrtf(sum(R, j) / static_cast<float>(k) + a.eps);
        return v;
    };

    if constexpr (EPI == kSilu) {
        const int i = blockIdx.x, half = m / 2;
        if (threadIdx.x < N && i < half) {
            const int j = threadIdx.x;
            const float g = total(0, j), u = total(1, j);
            static_cast<uint16_t*>(a.out)[static_cast<int64_t>(j) * half + i] = to_bf16(g / (1.0f + expf(-g)) * u);
        }
        return;
    }
    // Thread t < R * N writes output (row t % R, token t / R).
    if (threadIdx.x >= R * N) return;
    const int r = threadIdx.x % R, j = threadIdx.x / R;
    if (row_of(r) >= m) return;
    const int64_t idx = static_cast<int64_t>(j) * m + row_of(r);
    if (EPI == kAdd)
        static_cast<float*>(a.out)[idx] = resid + total(r, j);
    else if (a.out_f32)
        static_cast<float*>(a.out)[idx] = total(r, j);
    else
        static_cast<uint16_t*>(a.out)[idx] = to_bf16(total(r, j));
}

// Persistent form: one CTA per resident slot (SMs x occupancy). CTA b takes the units
// [b * units / grid, (b + 1) * units / grid) (a unit is a row, or with silu a gate | up row
// pair), in blocks of R rows (silu: R / 2 pairs). After pdl_wait it copies x once into shared
// memory (NORM: x * norm in f32, with sum(x^2) from the same pass, reduced once per CTA), then
// streams its row blocks, the next weight group in flight while it multiplies the current one.
// The chunk each thread takes and every sum order are those of gemv_kernel with the same R and
// D, so both give bitwise the same output.
template <int N, int R, int D, int EPI, bool NORM, int W>
__global__ void __launch_bounds__(kThreads) gemv_persistent_kernel(const Args a) {
    static_assert(EPI != kSilu || R % 2 == 0, "silu pairs gate rows with up rows");
    constexpr int U = EPI == kSilu ? R / 2 : R;  // units a row block
    // [N, k] x as the products read it. NORM: f32 x * norm, each 8-element chunk c split in
    // halves at [j][0][4c] and [j][1][4c] (16-byte reads across a warp, no bank conflicts);
    // else bf16 as in global memory.
    extern __shared__ uint4 x_smem[];
    __shared__ float part[2][kWarps][R][N];  // per-warp row sums, two buffers: one barrier a block
    __shared__ float ss_part[kWarps][N];     // NORM: per-warp sums of x^2
    using WC = WeightChunk<W>;
    using Chunk = typename WC::Chunk;
    constexpr int P = WC::kPieces;
    const int m = a.m, k = a.k;
    const int chunks = k / (8 * P), xchunks = k / 8;  // 16-byte weight chunks; 8-element pieces of x
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int units = EPI == kSilu ? m / 2 : m;
    const int u_begin = static_cast<int>(static_cast<int64_t>(blockIdx.x) * units / gridDim.x);
    const int u_end = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * units / gridDim.x);
    const int groups = (chunks + D * kThreads - 1) / (D * kThreads);  // weight groups a row block
    const int steps = (u_end - u_begin + U - 1) / U * groups;
    auto row_of = [&](int u, int r) { return EPI == kSilu && r >= U ? m / 2 + u + r - U : u + r; };
    auto valid = [&](int u, int r) { return u + r % U < u_end; };
    // Loads the weight group g of the row block at unit u.
    auto load_group = [&](int u, int g, Chunk(&dst)[D][R]) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = threadIdx.x + (g * D + d) * kThreads;
#pragma unroll
            for (int r = 0; r < R; ++r) dst[d][r] = valid(u, r) && c < chunks ? WC::load(a, row_of(u, r), c) : Chunk{};
        }
    };
    pdl_launch_dependents();
    Chunk next[D][R];
    load_group(u_begin, 0, next);
    {  // The rest of this CTA's rows towards L2.
        const int64_t row_bytes = WC::row_bytes(k);
        constexpr int halves = EPI == kSilu ? 2 : 1;
#pragma unroll
        for (int half = 0; half < halves; ++half)
            prefetch_rows_l2(
                static_cast<const char*>(a.w) + static_cast<int64_t>(row_of(u_begin, half * U)) * row_bytes,
                static_cast<int64_t>(u_end - u_begin) * row_bytes, halves, kThreads);
    }
    pdl_wait();
    // x into shared memory (NORM: with this thread's sums of x^2, in gemv_kernel's order). 4-bit
    // codes: x quantized a 32-value block at a time, by the thread gemv_kernel has take the block
    // (XBlock [N][k / 32]).
    float ss[N] = {};
    if constexpr (kIntX<W>) {
        XBlock* xq = reinterpret_cast<XBlock*>(x_smem);
        for (int c = threadIdx.x; c < chunks; c += kThreads) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                float xf[32];
                load_x_block<NORM>(a, j, c, xf, ss[j]);
                xq[static_cast<int64_t>(j) * chunks + c] = quantize_x_block(xf);
            }
        }
    }
    // The other layouts: x a piece (8 elements) a thread, consecutive threads consecutive pieces
    // (coalesced reads, conflict-free shared stores). NORM: with P == 1 a thread's pieces are its
    // weight chunks, so it sums their x^2 as it goes, in gemv_kernel's order; with P > 1 each
    // piece's x^2 is its own sum from 0 (piece_ss, after x), and once all are written each thread
    // adds those of its weight chunks' pieces in gemv_kernel's order (staging P pieces a thread,
    // by weight chunk, cost the 8B's FP8 decode 2.6% on an H100).
    float* piece_ss = reinterpret_cast<float*>(x_smem) + static_cast<int64_t>(N) * k;  // [N][xchunks]
    for (int c = threadIdx.x; !kIntX<W> && c < xchunks; c += kThreads) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            if constexpr (NORM) {
                float v[8], g[8];
                load_normed_chunk(a, j, c, v, g);
                float s = kPieceSums<W, NORM> ? 0.0f : ss[j];
#pragma unroll
                for (int e = 0; e < 8; ++e) s = fmaf(v[e], v[e], s);
                if constexpr (kPieceSums<W, NORM>)
                    piece_ss[static_cast<int64_t>(j) * xchunks + c] = s;
                else
                    ss[j] = s;
                float4* xs = reinterpret_cast<float4*>(x_smem) + static_cast<int64_t>(j) * 2 * xchunks;
                xs[c] = make_float4(v[0] * g[0], v[1] * g[1], v[2] * g[2], v[3] * g[3]);
                xs[xchunks + c] = make_float4(v[4] * g[4], v[5] * g[5], v[6] * g[6], v[7] * g[7]);
            } else {
                x_smem[static_cast<int64_t>(j) * xchunks + c] =
                    reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + static_cast<int64_t>(j) * k)[c];
            }
        }
    }
    if constexpr (kPieceSums<W, NORM>) {
        __syncthreads();
        for (int wc = threadIdx.x; wc < chunks; wc += kThreads)
#pragma unroll
            for (int p = 0; p < P; ++p)
#pragma unroll
                for (int j = 0; j < N; ++j) ss[j] += piece_ss[static_cast<int64_t>(j) * xchunks + wc * P + p];
    }
    if constexpr (NORM) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float v = ss[j];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) ss_part[warp][j] = v;
        }
    }
    // add: the residual value this thread adds to (thread t < R * N: row t % R, token t / R) for
    // the current row block, and the next one's, read one block ahead.
    float resid = 0.0f, resid_next = 0.0f;
    auto load_resid = [&](int u) {
        const int r = threadIdx.x % R, j = threadIdx.x / R;
        return threadIdx.x < R * N && valid(u, r)
                   ? static_cast<const float*>(a.out)[static_cast<int64_t>(j) * m + row_of(u, r)]
                   : 0.0f;
    };
    if constexpr (EPI == kAdd) resid = load_resid(u_begin);
    __syncthreads();
    // NORM: sqrt(mean(x^2) + eps) of the token this thread writes outputs of (if any).
    const int own_j = threadIdx.x / U;
    float rms = 1.0f;
    if constexpr (NORM) {
        if (own_j < N) {
            float v = 0;
#pragma unroll
            for (int q = 0; q < kWarps; ++q) v += ss_part[q][own_j];
            rms = sqrtf(v / static_cast<float>(k) + a.eps);
        }
    }

    float acc[R][N] = {};
    int u = u_begin, g = 0;            // the group being multiplied
    int next_u = u_begin, next_g = 0;  // the group in `next`
    int buf = 0;
    for (int s = 0; s < steps; ++s) {
        Chunk cur[D][R];
#pragma unroll
        for (int d = 0; d < D; ++d)
#pragma unroll
            for (int r = 0; r < R; ++r) cur[d][r] = next[d][r];
        if (++next_g == groups) next_g = 0, next_u += U;
        if (s + 1 < steps) {
            load_group(next_u, next_g, next);
            if constexpr (EPI == kAdd)
                if (next_g == 0) resid_next = load_resid(next_u);
        }
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = threadIdx.x + (g * D + d) * kThreads;
            if (c >= chunks) break;
            if constexpr (kIntX<W>) {
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    const XBlock xb = reinterpret_cast<const XBlock*>(x_smem)[static_cast<int64_t>(j) * chunks + c];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r][j] += int_x_dot<W>(cur[d][r], xb);
                }
            }
#pragma unroll
            for (int p = 0; !kIntX<W> && p < P; ++p) {
                const int x8 = c * P + p;  // the 8-element piece of x
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    float xf[8];
                    if constexpr (NORM) {
                        const float4* xs =
                            reinterpret_cast<const float4*>(x_smem) + static_cast<int64_t>(j) * 2 * xchunks;
                        const float4 x0 = xs[x8], x1 = xs[xchunks + x8];
                        xf[0] = x0.x, xf[1] = x0.y, xf[2] = x0.z, xf[3] = x0.w;
                        xf[4] = x1.x, xf[5] = x1.y, xf[6] = x1.z, xf[7] = x1.w;
                    } else {
                        unpack8(x_smem[static_cast<int64_t>(j) * xchunks + x8], xf);
                    }
                    fma_piece<W>(cur[d], p, xf, acc, j);
                }
            }
        }
        if (++g < groups) continue;
            // The row block at u is complete: sum the warps' parts in a fixed order and write.
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                float v = acc[r][j];
#pragma unroll
                for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (lane == 0) part[buf][warp][r][j] = v;
                acc[r][j] = 0.0f;
            }
        }
        __syncthreads();
        auto total = [&](int r, int j) {
            float v = 0;
#pragma unroll
            for (int q = 0; q < kWarps; ++q) v += part[buf][q][r][j];
            v *= row_factor<W>(a, row_of(u, r));
            if constexpr (NORM) v /= rms;
            return v;
        };
        if constexpr (EPI == kSilu) {
            if (threadIdx.x < U * N) {
                const int p = threadIdx.x % U, j = threadIdx.x / U;
                if (valid(u, p)) {
                    const float gv = total(p, j), uv = total(U + p, j);
                    static_cast<uint16_t*>(a.out)[static_cast<int64_t>(j) * (m / 2) + u + p] =
                        to_bf16(gv / (1.0f + expf(-gv)) * uv);
                }
            }
        } else if (threadIdx.x < R * N) {
            const int r = threadIdx.x % R, j = threadIdx.x / R;
            if (valid(u, r)) {
                const int64_t idx = static_cast<int64_t>(j) * m + row_of(u, r);
                if (EPI == kAdd)
                    static_cast<float*>(a.out)[idx] = resid + total(r, j);
                else if (a.out_f32)
                    static_cast<float*>(a.out)[idx] = total(r, j);
                else
                    static_cast<uint16_t*>(a.out)[idx] = to_bf16(total(r, j));
            }
        }
        resid = resid_next;
        buf ^= 1;
        g = 0;
        u += U;
    }
}

template <int N, int R, int D, int EPI, bool NORM, int W>
void launch_rd(const Args& a, cudaStream_t stream) {
    const int blocks = EPI == kSilu ? a.m / 2 : (a.m + R - 1) / R;
    launch_pdl(gemv_kernel<N, R, D, EPI, NORM, W>, static_cast<unsigned>(blocks), kThreads, 0, stream, a);
}

template <int N, int R, int D, int EPI, bool NORM, int W>
void launch_persistent(const Args& a, cudaStream_t stream) {
    // x (XBlocks, f32 normed or bf16), then the pieces' sums of x^2 (kPieceSums).
    const size_t smem = kIntX<W> ? static_cast<size_t>(N) * (a.k / 32) * sizeof(XBlock)
                                 : static_cast<size_t>(N) * a.k * (NORM ? 4 : 2) +
                                       (kPieceSums<W, NORM> ? static_cast<size_t>(N) * (a.k / 8) * 4 : 0);
    const int per_sm = resident_ctas<gemv_persistent_kernel<N, R, D, EPI, NORM, W>>(kThreads, smem);
    // Every CTA the same number of units, whole row blocks (the last CTA fewer): a CTA with one
    // more unit than the rest would set the kernel's end.
    constexpr int U = EPI == kSilu ? R / 2 : R;
    const int units = EPI == kSilu ? a.m / 2 : a.m, slots = sm_count() * per_sm;
    const int per_cta = (units + slots * U - 1) / (slots * U) * U;
    const int grid = (units + per_cta - 1) / per_cta;
    launch_pdl(gemv_persistent_kernel<N, R, D, EPI, NORM, W>, static_cast<unsigned>(grid), kThreads, smem, stream, a);
}

// Launches the persistent kernel where it was measured faster (H100, `bench latency` batch 1,
// each beside the one-block-per-CTA kernel in the same session) and returns whether it did:
// - the add products (o, down): 1B 946-958 against 925-938 tok/s over four sessions;
// - the normed products (q|k|v, gate|up) at k >= 4096: 8B 183.2-183.6 against 179.3-179.5 with
//   them and the add products persistent, where the add products alone gave 174.6-175.7 against
//   178.8-179.3; at k = 2048 (1B) they cost 1-2% (their ~8K short CTAs overlap the next kernel
//   better than a full persistent grid does).
// Plain products (the LM head persistent as well: 1B 927-932 against 940) and n > 1 (not
// measured) stay on gemv_kernel, as does an x too large to stage in shared memory.
// FP8 chunks carry twice the elements (twice the arithmetic a load). The one-CTA-per-row-block
// kernel wants half the chunks in flight per thread (H200, CudaGemvPerf.Report, fp8 n 1: 28672 x
// 4096 31.7 us at 2x1 against 43.0 at bf16's 2x4; 4096 x 14336 19.3 at 1x4 against 22.7 at 1x8).
// The persistent kernel's depth for FP8, a factor on bf16's: PEREGRINE_FP8_PERSISTENT_DEPTH =
// half | same | double (measurement knob; default below).
int fp8_persistent_depth() {
    static const int v = env_equals("PEREGRINE_FP8_PERSISTENT_DEPTH", "half")     ? 0
                         : env_equals("PEREGRINE_FP8_PERSISTENT_DEPTH", "double") ? 2
                                                                                  : 1;
    return v;
}

template <int N, int R, int D, int EPI, bool NORM, int W>
void launch_persistent_scaled(const Args& a, cudaStream_t stream) {
    if constexpr (W != kF8 || N > 1) {  // the depth knob at n = 1 only (fewer instantiations)
        launch_persistent<N, R, D, EPI, NORM, W>(a, stream);
    } else {
        switch (fp8_persistent_depth()) {
            case 0:
                return launch_persistent<N, R, D / 2, EPI, NORM, W>(a, stream);
            case 2:
                return launch_persistent<N, R, D * 2, EPI, NORM, W>(a, stream);
            default:
                return launch_persistent<N, R, D, EPI, NORM, W>(a, stream);
        }
    }
}

// The GGUF layouts in the persistent kernel (default; PEREGRINE_GGUF_GEMV=blocks turns it off.
// H100, batch-1 decode, 2026-11-27: 8B Q4_K_M 162.8 -> 308.0 tok/s, Q8_0 210.5 -> 311.4; 1B
// Q4_K_M 825.9 -> 1,152.5, Q8_0 1,079.6 -> 1,333.3):
// a row of 4-bit codes is a quarter of bf16's bytes (k = 4096: 128 chunks, one a thread), so
// one short CTA per row pair, as gemv_kernel runs it, does a chunk a thread between its
// prologue (x, the norm) and its reduction. Here x is staged once a CTA and row blocks are
// streamed, each thread keeping about 8 chunks in flight: R rows x D chunks by the row's chunks.
// Plain products (the LM head; a tensor-parallel rank's o / down) too: gemv_kernel quantizes x
// again for every chunk of every row pair of the 4- and 6-bit layouts (~5 instructions a value),
// here once a CTA. H200, CudaGemvPerf.GgufLayoutsReport, n 1, 128256 x 4096 (the 8B head): gq6_32
// 185.4 -> 107.3 us, gq4_32 154.7 -> 78.1 us; 8B batch-1 decode (2026-11-29, three rounds) Q4_K_M
// (Q6_K head) 486.2-486.3 -> 517.2-517.7 tok/s, Q8_0 (int8 layouts, Q8_0 head) 362.6-363.2 ->
// 367.2-367.4. PEREGRINE_GGUF_GEMV_PLAIN=blocks keeps plain products on gemv_kernel (measurement
// knob).
bool gguf_plain_persistent() {
    static const bool on = !env_equals("PEREGRINE_GGUF_GEMV_PLAIN", "blocks");
    return on;
}

template <int N, int EPI, bool NORM, int W>
bool launch_persistent_gguf(const Args& a, cudaStream_t stream) {
    if constexpr ((EPI == kSilu && !NORM) || W <= kF8) {
        return false;
    } else {
        const int k = a.k, chunks = k / (8 * WeightChunk<W>::kPieces);
        if (!gguf_persistent() || g_rows > 0 || static_cast<size_t>(N) * k * (NORM ? 4 : 2) > kMaxStagedX) return false;
        if (EPI == kPlain && !NORM && !gguf_plain_persistent()) return false;
        if (chunks <= kThreads)
            launch_persistent<N, 8, 1, EPI, NORM, W>(a, stream);
        else if (chunks <= 2 * kThreads)
            launch_persistent<N, 4, 2, EPI, NORM, W>(a, stream);
        else
            launch_persistent<N, 2, 4, EPI, NORM, W>(a, stream);
        return true;
    }
}

// bf16 / FP8 products of 2-4 rows in the persistent kernel (x staged once a CTA; one short CTA
// per row pair re-reads all n rows of x, for a normed product in f32 with the norm weight: the
// 8B's gate|up at n = 4 read ~1.1 GB of x from L2 for 235 MB of weights). H200, decode tok/s,
// n = 1 only / normed products too / normed and add products of >= 4096 rows (2026-11-28, one
// call): 8B bf16 batch 2 366.7 / 426.8 / 487.5, batch 4 545.6 / 682.4 / 688.7; 1B batch 4 3,134.7
// / 3,133.9 / 3,133.3 (its normed products have k = 2048; add products of every size, "all",
// cost it 4.7%: 2,992.6). PEREGRINE_GEMV_PERSISTENT_ROWS = one | norm | auto (the default: normed
// products, and add products of >= 4096 rows) | all. Whether such a product (m rows) may take it.
bool persistent_past_one_row(bool norm, int m) {
    enum Mode { kOne, kNorm, kAuto, kAll };
    static const Mode mode = env_equals("PEREGRINE_GEMV_PERSISTENT_ROWS", "one")    ? kOne
                             : env_equals("PEREGRINE_GEMV_PERSISTENT_ROWS", "norm") ? kNorm
                             : env_equals("PEREGRINE_GEMV_PERSISTENT_ROWS", "all")  ? kAll
                                                                                    : kAuto;
    return mode != kOne && (norm || mode == kAll || (mode == kAuto && m >= 4096));
}

// Plain products with an f32 output of at most kMaxPlainPersistentRows rows: the o / down products
// of a tensor-parallel rank (their sum and the residual add are the peer all-reduce's); a full LM
// head has more rows (a vocabulary split as small would take it too).
// PEREGRINE_GEMV_PERSISTENT_PLAIN=0 | 1: measurement knob, off. Not yet timed at TP 2, where o /
// down run on gemv_kernel while TP 1's fused add products are persistent; with it on,
// CudaTensorParallel* and CudaGemv.* pass on an H200 (2026-11-28).
constexpr int kMaxPlainPersistentRows = 16384;
bool persistent_plain(const Args& a) {
    static const bool on = env_equals("PEREGRINE_GEMV_PERSISTENT_PLAIN", "1");
    return on && a.out_f32 && a.m <= kMaxPlainPersistentRows;
}

template <int N, int EPI, bool NORM, int W>
bool launch_persistent_by_k(const Args& a, cudaStream_t stream) {
    if constexpr (W > kF8) {
        return launch_persistent_gguf<N, EPI, NORM, W>(a, stream);
    } else if constexpr (EPI == kSilu && !NORM) {
        return false;
    } else {
        if (EPI == kPlain && !NORM && !persistent_plain(a)) return false;
        const int k = a.k;
        if (N > 1 && !persistent_past_one_row(NORM, a.m)) return false;
        if (g_rows > 0 || (NORM && k < 4096) || static_cast<size_t>(N) * k * (NORM ? 4 : 2) > kMaxStagedX) return false;
        if constexpr (!NORM) {
            if (k <= 2048) {
                launch_persistent_scaled<N, 2, 2, EPI, NORM, W>(a, stream);
                return true;
            }
        }
        if constexpr (EPI == kSilu) {  // two rows a block by construction
            launch_persistent_scaled<N, 2, 4, EPI, NORM, W>(a, stream);
        } else if (k <= 4096) {
            launch_persistent_scaled<N, 2, 4, EPI, NORM, W>(a, stream);
        } else {
            launch_persistent_scaled<N, 1, 8, EPI, NORM, W>(a, stream);
        }
        return true;
    }
}

// The product of n rows of x for gemv_mma.cu's tensor-core kernel (bf16 or FP8 weights).
template <int EPI>
MmaProduct mma_product(const Args& a, bool f8, int n) {
    return MmaProduct{.x = a.x,
                      .norm = a.norm,
                      .eps = a.eps,
                      .weight = f8 ? MmaProduct::kF8 : MmaProduct::kBf16,
                      .w = a.w,
                      .scale = a.w_scale,
                      .out = a.out,
                      .out_f32 = a.out_f32,
                      .n = n,
                      .m = a.m,
                      .k = a.k,
                      .epilogue = static_cast<MmaProduct::Epilogue>(EPI)};
}

// Chunks in flight per thread by k (measured on an H100 over the Llama 1B/8B shapes,
// CudaGemvPerf.Report): rows up to 4096 long want two rows per CTA so there are enough loads
// at once, longer rows one row with deeper groups. set_gemv_config overrides it.
template <int N, int EPI, bool NORM, int W>
void launch(const Args& a, cudaStream_t stream) {
    if constexpr (W == kF8 || W == kBf16)  // tensor cores where they take it (gemv_mma.cu)
        if (g_rows == 0 && gemv_mma(mma_product<EPI>(a, W == kF8, N), stream)) return;
    if (launch_persistent_by_k<N, EPI, NORM, W>(a, stream)) return;
    const int k = a.k;
    int rows = k <= 4096 ? 2 : 1;
    int depth = k <= 2048 ? (N == 1 ? 2 : 1) : k <= 4096 ? 4 : 8;
    // Chunks of e4m3 and int8 codes hold 16 values, of 4-bit codes 32: fewer in flight for the
    // same work a load (fp8: see fp8_persistent_depth; the GGUF layouts are not tuned yet).
    if constexpr (W == kF8 || W == kI8B32 || W == kI8B16) depth = std::max(1, depth / 2);
    if constexpr (kIntX<W>) depth = std::max(1, depth / 4);
    if (g_rows > 0) rows = g_rows, depth = g_depth;
    // The normed q|k|v product (x read as f32 with the norm weight, 4x the bytes of a bf16 x)
    // wants x shared by more rows: 4 rows per CTA (H100, 1B decode 898 -> 908 tok/s).
    if constexpr (NORM && EPI == kPlain)
        if (k <= 2048 && g_rows == 0) return launch_rd<N, 4, 1, EPI, NORM, W>(a, stream);
    if constexpr (EPI == kSilu) {  // two rows per CTA by construction
        if (depth <= 1) return launch_rd<N, 2, 1, EPI, NORM, W>(a, stream);
        if (depth == 2) return launch_rd<N, 2, 2, EPI, NORM, W>(a, stream);
        return launch_rd<N, 2, 4, EPI, NORM, W>(a, stream);
    } else {
        if (rows == 2 && depth == 2) return launch_rd<N, 2, 2, EPI, NORM, W>(a, stream);
        if (rows == 2 && depth == 4) return launch_rd<N, 2, 4, EPI, NORM, W>(a, stream);
        if (rows == 1 && depth == 4) return launch_rd<N, 1, 4, EPI, NORM, W>(a, stream);
        if (rows == 1 && depth == 8) return launch_rd<N, 1, 8, EPI, NORM, W>(a, stream);
        return launch_rd<N, 2, 1, EPI, NORM, W>(a, stream);
    }
}

template <int EPI, bool NORM, int W>
void dispatch_n(const Args& a, int n, cudaStream_t stream) {
    switch (n) {
        case 1:
            return launch<1, EPI, NORM, W>(a, stream);
        case 2:
            return launch<2, EPI, NORM, W>(a, stream);
        case 3:
            return launch<3, EPI, NORM, W>(a, stream);
        default:
            return launch<4, EPI, NORM, W>(a, stream);
    }
}

Args make_args(const void* x, const float* norm, float eps, GemvWeight w, void* out, bool out_f32, int m, int k) {
    return Args{x, norm, eps, w.data, w.scale, w.factors, out, out_f32, m, k};
}

}  // namespace
}  // namespace peregrine::cuda
