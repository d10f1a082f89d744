// Decode products on tensor cores: mma.sync m16n8k16, f32 accumulate; FP8 weights (E4M3, a
// factor per row) as f16 operands, bf16 weights as they are.
//
// Why: gemv.cu's kernels turn every e4m3 value into f32 and multiply on the FMA pipe (H200, ncu,
// 8B gate | up: 0.67 warp instructions issued a cycle a scheduler against bf16's 0.38, 3.0 TB/s
// against 4.05), and each extra row of x costs a full pass of that arithmetic. Here a 16-byte chunk
// of e4m3 codes is 8 conversions (e4m3x2 -> f16x2, exact) and 4 mma whatever n (1..8). H200,
// 2026-11-29, `bench latency` decode tok/s, gemv.cu's kernels -> these: 8B b1 365.7 -> 383.1, b2
// 532.9 -> 625.6; 1B b1 1,137.7 -> 1,470.9, b2 1,871.1 -> 2,693.6 (PEREGRINE_FP8_GEMV=fma: the old
// ones). bf16 weights (a chunk: 8 values, 2 mma, no conversion) take it where it was measured
// faster than gemv.cu's kernel (bf16_auto below).
//
// Fragments (warp_mma.cuh): the weight is mma's B (8 weight rows, k), x its A (token j in row j;
// a normed x's low part in row 8 + j at n <= 4, staged_lo below). Lane 4n + q loads the 16 bytes
// (V values: 16 e4m3, 8 bf16) of weight row n at byte offset 64s + 16q (segment s: a warp load is
// 8 rows x 64 bytes, 4V values); its values 4i + {0, 1} are mma i's k 2q + {0, 1}, values 4i +
// {2, 3} its k 8 + 2q + {0, 1}. That permutation of k is the same for x: lane 4j + q reads
// x[j][4Vs + Vq .. + V - 1]. Output row 2q + {0, 1} of token j is on lane 4j + q.
// x is staged once a CTA in the operand type: f16 times 2^e per token, e putting its largest
// |value| in [2^14, 2^15) (bf16 values land exact), or bf16 as it is; a normed x (f32 x * norm)
// of n <= 4 rows times bf16 weights is split hi + lo, lo = x - hi (bf16: ~16 bits); of 5-8 rows,
// and of any rows times FP8 weights (staged_lo), it is hi alone (f16: 11 bits; bf16: 8, as the
// bf16 x a norm pass + cuBLASLt would multiply), staged as a plain x: 4 bytes a value would not
// fit 8 rows of the 8B's x. An f16 or bf16 times an e4m3 or bf16 value is exact in f32. One pass
// finds the largest |value| (an x staged hi + lo kept in shared memory as f32 meanwhile, else
// read again), a second writes the fragments.
// Work: a unit is 8 weight rows (silu: 4 gate rows and their 4 up rows); a CTA of W warps takes
// per_cta consecutive units, its warps splitting each unit's k (warp w, group g: segments (Wg +
// w) * D .. + D - 1), the next group's D loads a lane in flight while it multiplies one.
#include "backend/cuda/gemv_mma.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/persistent_products.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "backend/cuda/weight_chunks.cuh"
#include "core/env.h"

namespace peregrine::cuda {
namespace {

constexpr int D = 8;      // segments in flight a lane (4 measured slower on an H200: fewer bytes in flight)
constexpr int kSeg = 64;  // bytes of a weight row a warp load takes
using Epi = MmaProduct::Epilogue;

// Values in a lane's 16-byte chunk of weight: 16 e4m3 codes (4 mma) or 8 bf16 (2 mma).
template <bool F8>
constexpr int kVals = F8 ? 16 : 8;
// One token's staged x, hi + lo (LO: a normed x of n <= 4 rows, staged_lo): 4 bytes a value, mma's A
// fragments in the order lanes read them. Chunk ch (the V values lane q = ch % 4 multiplies, 4V
// bytes) holds, for each of its mma i, {hi(4i, 4i+1), lo(4i, 4i+1), hi(4i+2, 4i+3), lo(4i+2,
// 4i+3)} (operand-type pairs) in 16-byte slot slot_of(ch, i): one 16-byte load a mma. With FP8
// (64-byte chunks) slot i ^ ((ch >> 1) & 1) keeps lanes q = 0..3 on distinct banks, and token
// j + 1 starts 32 bytes further modulo 128 than token j; with bf16 (32-byte chunks) slot i and 16
// bytes: no bank conflicts either way (k is a multiple of 4V). Piece c (values 8c .. 8c + 7:
// fragments 2 (c % P) and 2 (c % P) + 1 of chunk c / P, P = V / 8) is bytes [32c, 32c + 32): a
// normed x is staged there as f32 and converted in place.
// Not LO: lo is 0 (or dropped), so only the hi pairs are staged, 2 bytes a value, and in that
// layout they fall in x's own order: mma i of chunk ch reads bytes 2V ch + 8i .. + 7 = {hi(4i,
// 4i+1), hi(4i+2, 4i+3)}, a 16-byte load two mma. Lanes q = 0..3 read 16 bytes at 2V q (+ 16h):
// with tokens 16 (FP8, 2V = 32) or 64 (bf16, 2V = 16) bytes further modulo 128, the 8 lanes of a
// 16-byte load phase (tokens j, j + 1) hit distinct banks. Half the bytes: the 8B's FP8 down
// product (k 14,336) stages 3 tokens within 96 KB where it staged 1.
__host__ __device__ constexpr int64_t token_bytes(bool f8, bool lo, int k) {
    return lo ? 4 * int64_t{k} + (f8 ? 32 : 16) : 2 * int64_t{k} + (f8 ? 16 : 64);
}
// Whether a normed x of n rows may be staged hi + lo (4 bytes a value) rather than hi alone
// (the kernel's LO; staged_lo below says where a product takes it).
__host__ __device__ constexpr bool lo_rows(bool norm, int n) {
    return norm && n <= 4;
}
template <bool F8>
__device__ __forceinline__ int slot_of(int ch, int i) {
    return F8 ? i ^ ((ch >> 1) & 1) : i;
}

__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(uint32_t two) {  // the low 16 bits
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
    return static_cast<uint32_t>(r.x) | static_cast<uint32_t>(r.y) << 16;
}
__device__ __forceinline__ uint32_t bits(__half2 h) {
    return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t bits(__nv_bfloat162 h) {
    return *reinterpret_cast<const uint32_t*>(&h);
}
// The operand pair (hi, lo) of values s0, s1: F8 f16, else bf16; lo = value - hi (0 unless LO).
template <bool F8, bool LO>
__device__ __forceinline__ void split_pair(float s0, float s1, uint32_t& hi, uint32_t& lo) {
    if constexpr (F8) {
        const __half2 h = __floats2half2_rn(s0, s1);
        const float2 f = __half22float2(h);
        hi = bits(h);
        lo = LO ? bits(__floats2half2_rn(s0 - f.x, s1 - f.y)) : 0u;
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(s0, s1);
        const float2 f = __bfloat1622float2(h);
        hi = bits(h);
        lo = LO ? bits(__floats2bfloat162_rn(s0 - f.x, s1 - f.y)) : 0u;
    }
}

// Piece c (8 values) of token j's x: NORM x * norm (adding x^2 to ss), else the bf16 values.
template <bool NORM>
__device__ __forceinline__ void x_piece(const MmaProduct& a, int j, int c, float (&v)[8], float& ss) {
    if constexpr (NORM) {
        float x[8], g[8];
        load_normed_piece(static_cast<const float*>(a.x), a.norm, a.k, j, c, x, g);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            ss = fmaf(x[e], x[e], ss);
            v[e] = x[e] * g[e];
        }
    } else {
        unpack8(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + int64_t{j} * a.k)[c], v);
    }
}

// arr[j] for a j known only at run time, without local memory.
template <int N>
__device__ __forceinline__ float pick(const float (&arr)[N], int j) {
    float v = arr[0];
#pragma unroll
    for (int i = 1; i < N; ++i) v = j == i ? arr[i] : v;
    return v;
}

// LO: x staged hi + lo (lo_rows only), else in x's own order, hi alone.
template <bool F8, int N, int W, int EPI, bool NORM, bool LO>
__global__ void __launch_bounds__(32 * W) mma_gemv_kernel(const MmaProduct a, int per_cta) {
    constexpr int V = kVals<F8>, P = V / 8;  // values a lane's chunk, 8-value pieces a chunk
    static_assert(N >= 1 && N <= kMaxMmaRows, "1..8 rows");
    static_assert(!LO || lo_rows(NORM, N), "hi + lo: a normed x of 1..4 rows");
    const char* wb = static_cast<const char*>(a.w);
    extern __shared__ uint4 x_smem[];
    __shared__ float part[2][W][N][8];             // per-warp sums of a unit, two buffers: one barrier a unit
    __shared__ float red[W][N][2];                 // per-warp amax and sum of x^2
    constexpr int RU = EPI == Epi::kSilu ? 4 : 8;  // rows (silu: gate | up pairs) a unit
    const int m = a.m, k = a.k, segs = k / (4 * V);
    const int64_t row_bytes = int64_t{k} * (F8 ? 1 : 2);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n8 = lane / 4, q = lane % 4;
    const int rows = EPI == Epi::kSilu ? m / 2 : m;
    const int b_begin = blockIdx.x * per_cta, b_end = min((rows + RU - 1) / RU, b_begin + per_cta);
    const int groups = (segs + W * D - 1) / (W * D);
    const int steps = (b_end - b_begin) * groups;
    // The weight row of unit b that lane slot n (0..7) multiplies; past the end a valid row whose
    // sums no output takes (so loads need no row check).
    auto row_of = [&](int b, int n) {
        if constexpr (EPI == Epi::kSilu) {
            const int p = min(b * 4 + (n & 3), rows - 1);
            return n < 4 ? p : rows + p;
        } else {
            return min(b * 8 + n, m - 1);
        }
    };
    auto load_group = [&](int b, int g, uint4(&dst)[D]) {
        const int s0 = (g * W + warp) * D;  // this warp's first segment
        const uint4* p = reinterpret_cast<const uint4*>(wb + row_of(b, n8) * row_bytes + int64_t{s0} * kSeg) + q;
        if (s0 + D <= segs) {
#pragma unroll
            for (int d = 0; d < D; ++d) dst[d] = __ldg(p + d * (kSeg / 16));
        } else {
#pragma unroll
            for (int d = 0; d < D; ++d) dst[d] = s0 + d < segs ? __ldg(p + d * (kSeg / 16)) : make_uint4(0, 0, 0, 0);
        }
    };
    pdl_launch_dependents();
    uint4 next[D];
    load_group(b_begin, 0, next);
    {  // The rest of this CTA's rows towards L2.
        const int64_t first = int64_t{b_begin} * RU, count = min(int64_t{b_end} * RU, int64_t{rows}) - first;
        constexpr int halves = EPI == Epi::kSilu ? 2 : 1;
#pragma unroll
        for (int half = 0; half < halves; ++half)
            prefetch_rows_l2(wb + (first + half * rows) * row_bytes, count * row_bytes, halves, 32 * W);
    }
    pdl_wait();

    // x: each token's largest |value| (NORM: and sum of x^2), the values kept in shared memory
    // as f32 (LO) or read again (from L1); then each thread writes its pieces' fragments.
    char* xb = reinterpret_cast<char*>(x_smem);
    const int64_t tb = token_bytes(F8, LO, k);
    const int pieces = k / 8;
    // Only FP8 (its per-token factor) and a normed x (its sum of squares, its f32 copy) need this
    // first pass: a bf16 x that is not normed is staged as it is, unscaled.
    constexpr bool kScan = F8 || NORM;
    if constexpr (kScan) {
        float amax[N], ss[N];
#pragma unroll
        for (int j = 0; j < N; ++j) amax[j] = 0.0f, ss[j] = 0.0f;
#pragma unroll 4
        for (int c = threadIdx.x; c < pieces; c += (32 * W)) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                float v[8];
                x_piece<NORM>(a, j, c, v, ss[j]);
#pragma unroll
                for (int e = 0; e < 8; ++e) amax[j] = fmaxf(amax[j], fabsf(v[e]));
                if constexpr (LO) {
                    float4* dst = reinterpret_cast<float4*>(xb + j * tb + 32 * c);
                    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
                    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < N; ++j) {
#pragma unroll
            for (int o = 16; o > 0; o /= 2) {
                amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], o));
                ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
            }
            if (lane == 0) red[warp][j][0] = amax[j], red[warp][j][1] = ss[j];
        }
        __syncthreads();
    }
    float xscale[N], post[N];  // 2^e of the staged x; what a sum is multiplied by (2^-e, NORM / rms)
#pragma unroll
    for (int j = 0; j < N; ++j) {
        float am = 0.0f, s = 0.0f;
#pragma unroll
        for (int w = 0; kScan && w < W; ++w) am = fmaxf(am, red[w][j][0]), s += red[w][j][1];
        int shift = 0;  // bf16 operands: f32's range, no shift
        if (F8 && am > 0.0f && isfinite(am)) {
            int e = 0;
            frexpf(am, &e);  // am = f * 2^e, f in [0.5, 1)
            shift = min(max(15 - e, -100), 100);
        }
        xscale[j] = ldexpf(1.0f, shift);
        post[j] = ldexpf(1.0f, -shift);
        if constexpr (NORM) post[j] /= sqrtf(s / static_cast<float>(k) + a.eps);
    }
    for (int c = threadIdx.x; c < pieces; c += (32 * W)) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float v[8];
            if constexpr (LO) {
                const float4* src = reinterpret_cast<const float4*>(xb + j * tb + 32 * c);
                const float4 v0 = src[0], v1 = src[1];
                v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
            } else {
                float unused = 0.0f;
                x_piece<NORM>(a, j, c, v, unused);
            }
            uint32_t f[2][4];  // the fragments of mma 2 (c % P) and 2 (c % P) + 1
#pragma unroll
            for (int h = 0; h < 4; ++h)  // value pairs (2h, 2h + 1)
                split_pair<F8, LO>(v[2 * h] * xscale[j], v[2 * h + 1] * xscale[j], f[h / 2][2 * (h % 2)],
                                   f[h / 2][2 * (h % 2) + 1]);
            if constexpr (LO) {
                char* dst = xb + j * tb + 4 * V * (c / P);
#pragma unroll
                for (int t = 0; t < 2; ++t)
                    *reinterpret_cast<uint4*>(dst + 16 * slot_of<F8>(c / P, 2 * (c % P) + t)) =
                        make_uint4(f[t][0], f[t][1], f[t][2], f[t][3]);
            } else {  // the hi pairs of values 0..7, in order
                *reinterpret_cast<uint4*>(xb + j * tb + 16 * c) = make_uint4(f[0][0], f[0][2], f[1][0], f[1][2]);
            }
        }
    }
    __syncthreads();

    const bool has_x = n8 < N;  // lanes holding a token's row of A
    // Lane q's chunk of segment s is chunk 4s + q; (ch >> 1) & 1 = q >> 1 for all of them.
    constexpr int xv = LO ? 4 : 2;  // staged bytes a value
    const char* xl = xb + (has_x ? n8 : 0) * tb + xv * V * q;
    int slot_off[V / 4];
#pragma unroll
    for (int i = 0; i < V / 4; ++i) slot_off[i] = 16 * slot_of<F8>(q, i);
    float acc0[4] = {}, acc1[4] = {};  // two chains of mma (even / odd i)
    int b = b_begin, g = 0, nb = b_begin, ng = 0, buf = 0;
    for (int s = 0; s < steps; ++s) {
        uint4 cur[D];
#pragma unroll
        for (int d = 0; d < D; ++d) cur[d] = next[d];
        if (++ng == groups) ng = 0, ++nb;
        if (s + 1 < steps) load_group(nb, ng, next);
        const int s0 = (g * W + warp) * D;
#pragma unroll
        for (int d = 0; d < D; ++d) {
            if (s0 + d >= segs) break;  // warp-uniform
            const char* xp = xl + int64_t{s0 + d} * (4 * xv * V);
            const uint32_t wv[4] = {cur[d].x, cur[d].y, cur[d].z, cur[d].w};
            uint4 pair = make_uint4(0, 0, 0, 0);  // not LO: mma i and i + 1's hi pairs (i even)
#pragma unroll
            for (int i = 0; i < V / 4; ++i) {
                uint32_t fa[4];
                if constexpr (LO) {
                    uint4 fr = make_uint4(0, 0, 0, 0);
                    if (has_x) fr = *reinterpret_cast<const uint4*>(xp + slot_off[i]);
                    fa[0] = fr.x, fa[1] = fr.y, fa[2] = fr.z, fa[3] = fr.w;
                } else {  // one 16-byte load two mma; rows 8-15 (lo) 0
                    if (i % 2 == 0 && has_x) pair = *reinterpret_cast<const uint4*>(xp + 8 * i);
                    fa[0] = i % 2 == 0 ? pair.x : pair.z, fa[1] = 0u;
                    fa[2] = i % 2 == 0 ? pair.y : pair.w, fa[3] = 0u;
                }
                if constexpr (F8) {
                    const uint32_t b0 = f16x2_of_e4m3x2(wv[i]), b1 = f16x2_of_e4m3x2(wv[i] >> 16);
                    mma_f16_16816(i % 2 == 0 ? acc0 : acc1, fa, b0, b1);
                } else {  // values 4i, 4i + 1 in word 2i, 4i + 2, 4i + 3 in word 2i + 1
                    mma_bf16_16816(i % 2 == 0 ? acc0 : acc1, fa, wv[2 * i], wv[2 * i + 1]);
                }
            }
        }
        if (++g < groups) continue;
        // Unit b is complete: the warps' sums in a fixed order, then the epilogue.
        if (has_x) {  // row n8 + 8 is token n8's lo part (or 0)
            part[buf][warp][n8][2 * q] = (acc0[0] + acc0[2]) + (acc1[0] + acc1[2]);
            part[buf][warp][n8][2 * q + 1] = (acc0[1] + acc0[3]) + (acc1[1] + acc1[3]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc0[i] = 0.0f, acc1[i] = 0.0f;
        __syncthreads();
        auto total = [&](int j, int r, int row) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < W; ++w) v += part[buf][w][j][r];
            return v * (F8 ? __ldg(a.scale + row) : 1.0f) * pick(post, j);
        };
        if constexpr (EPI == Epi::kSilu) {
            if (threadIdx.x < 4 * N) {
                const int j = threadIdx.x / 4, p = threadIdx.x % 4, pair = b * 4 + p;
                if (pair < rows) {
                    const float gv = total(j, p, pair), uv = total(j, 4 + p, rows + pair);
                    static_cast<__nv_bfloat16*>(a.out)[int64_t{j} * rows + pair] =
                        __float2bfloat16_rn(gv / (1.0f + expf(-gv)) * uv);
                }
            }
        } else if (threadIdx.x < 8 * N) {
            const int j = threadIdx.x / 8, r = threadIdx.x % 8, row = b * 8 + r;
            if (row < m) {
                const int64_t idx = int64_t{j} * m + row;
                const float v = total(j, r, row);
                if (EPI == Epi::kAdd)
                    static_cast<float*>(a.out)[idx] += v;
                else if (a.out_f32)
                    static_cast<float*>(a.out)[idx] = v;
                else
                    static_cast<__nv_bfloat16*>(a.out)[idx] = __float2bfloat16_rn(v);
            }
        }
        buf ^= 1;
        g = 0;
        ++b;
    }
}

// How a product's units (8 rows; silu 4 pairs) go to CTAs of W warps: every CTA the same number
// (the last fewer), since one with a unit more than the rest would set the kernel's end.
struct Plan {
    int units, slots, per_cta, grid;
    size_t smem;  // bytes of staged x a CTA
};
template <bool F8, int N, int W, int EPI, bool NORM, bool LO>
Plan plan(const MmaProduct& p) {
    constexpr int RU = EPI == Epi::kSilu ? 4 : 8;
    Plan pl;
    pl.smem = static_cast<size_t>(N * token_bytes(F8, LO, p.k));
    pl.units = ((EPI == Epi::kSilu ? p.m / 2 : p.m) + RU - 1) / RU;
    pl.slots = sm_count() * resident_ctas<mma_gemv_kernel<F8, N, W, EPI, NORM, LO>>(32 * W, pl.smem);
    pl.per_cta = (pl.units + pl.slots - 1) / pl.slots;
    pl.grid = (pl.units + pl.per_cta - 1) / pl.per_cta;
    return pl;
}
template <bool F8, int N, int W, int EPI, bool NORM, bool LO>
void launch_planned(const MmaProduct& p, const Plan& pl, cudaStream_t stream) {
    launch_pdl(mma_gemv_kernel<F8, N, W, EPI, NORM, LO>, dim3(static_cast<unsigned>(pl.grid)), dim3(32 * W), pl.smem,
               stream, p, pl.per_cta);
}

// CTAs of 4 warps at n <= 2 where each takes several units and they fill the slots, else of 8
// (twice the warps on each unit, half the CTAs: fewer slots left idle by the last fraction of a
// wave). H200, CudaGemvPerf.DecodeProductsOnTensorCores (FP8), 4 / 8 warps (us): 8B gate|up n 1 32.2 / 35.9, n 2
// 34.8 / 36.8, n 3 45.1 / 38.4, n 4 47.5 / 39.9; n 1 q|k|v 12.4 / 10.6, down 25.9 / 19.6, o 7.5 /
// 7.6 (bf16: not measured). PEREGRINE_FP8_MMA_WARPS = 4 | 8 forces one (measurement knob).
template <bool F8, int N, int EPI, bool NORM, bool LO = false>
void launch(const MmaProduct& p, cudaStream_t stream) {
    static const int forced = env_int("PEREGRINE_FP8_MMA_WARPS", 0);
    if (forced == 4 || (forced != 8 && N <= 2)) {  // only then are 4-warp CTAs a candidate
        const Plan p4 = plan<F8, N, 4, EPI, NORM, LO>(p);
        if (forced == 4 || (p4.per_cta >= 4 && p4.units >= 0.85 * static_cast<double>(p4.per_cta) * p4.slots))
            return launch_planned<F8, N, 4, EPI, NORM, LO>(p, p4, stream);
    }
    launch_planned<F8, N, 8, EPI, NORM, LO>(p, plan<F8, N, 8, EPI, NORM, LO>(p), stream);
}

// Whether p's x is staged hi + lo: a normed x of 1-4 rows of bf16 weights, and of FP8 weights
// only with PEREGRINE_FP8_NORM_LO=1. FP8 takes f16 hi alone (11 bits against E4M3's 4; half the
// staged bytes, no lo pass): H200, decode tok/s, hi + lo / hi alone (session 32): 8B FP8 batch 1
// 392.3 / 404.7, 392.3 / 405.0, batch 2 721.4 / 756.2, batch 4 1,213.9 / 1,334.6; 1B FP8 batch 1
// 1,509.7 / 1,552.9, batch 4 4,598.5 / 4,836.9; 70B FP8 batch 1 54.1 / 56.1, batch 4 154.5 /
// 170.8. Trained fixture decode agreement with bf16 0.9810 / 0.9805 (CudaFp8.TextTrained*).
int g_fp8_lo = -1;  // set_fp8_norm_lo
bool staged_lo(const MmaProduct& p) {
    static const bool fp8_env = env_equals("PEREGRINE_FP8_NORM_LO", "1");
    const bool fp8_lo = g_fp8_lo >= 0 ? g_fp8_lo == 1 : fp8_env;
    return lo_rows(p.norm != nullptr, p.n) && (p.weight != MmaProduct::kF8 || fp8_lo);
}

// A normed product, x staged as staged_lo(p) says (bf16 weights: hi + lo at 1-4 rows).
template <bool F8, int N, int EPI>
void launch_normed(const MmaProduct& p, cudaStream_t stream) {
    if constexpr (!lo_rows(true, N)) {
        launch<F8, N, EPI, true, false>(p, stream);
    } else if constexpr (!F8) {
        launch<F8, N, EPI, true, true>(p, stream);
    } else {
        if (staged_lo(p)) return launch<F8, N, EPI, true, true>(p, stream);
        launch<F8, N, EPI, true, false>(p, stream);
    }
}

template <bool F8, int N>
void dispatch_epilogue(const MmaProduct& p, cudaStream_t stream) {
    const bool norm = p.norm != nullptr;
    switch (p.epilogue) {
        case Epi::kSilu:
            return norm ? launch_normed<F8, N, Epi::kSilu>(p, stream) : launch<F8, N, Epi::kSilu, false>(p, stream);
        case Epi::kAdd:
            return launch<F8, N, Epi::kAdd, false>(p, stream);
        default:
            return norm ? launch_normed<F8, N, Epi::kPlain>(p, stream) : launch<F8, N, Epi::kPlain, false>(p, stream);
    }
}

// The instantiation for p.n (1..kMaxMmaRows, checked by gemv_mma_takes).
template <bool F8, int... I>
void dispatch_n(const MmaProduct& p, cudaStream_t stream, std::integer_sequence<int, I...>) {
    (void)((p.n == I + 1 && (dispatch_epilogue<F8, I + 1>(p, stream), true)) || ...);
}

// bf16 by default only where gemv.cu's FMA kernel was measured slower (H200, 2026-11-29,
// CudaGemvPerf.DecodeProductsOnTensorCores): normed products whose x 3-4 rows share, and the
// normed gate|up below k 4096, which gemv.cu has no persistent kernel for (1B gate|up at n 1:
// 21.5 -> 18.2 us). Everywhere else its FMA kernel is as fast or faster (1B q|k|v at n 1: 4.5
// against 5.5 us; o and down products at 1-2 rows).
// And o / down of 3-4 rows whose x fits in kMaxStagedX (two CTAs an SM), which otherwise go to
// cuBLASLt: H200 decode tok/s at batch 4, cuBLASLt / here / here with no bound (session 30, two
// rounds): 1B 3,972.5 / 4,321.9 / 4,320.4, 3,972.6 / 4,318.5 / 4,320.8; Qwen3-1.7B 1,969.6 /
// 2,100.7 / 2,116.0, 1,922.7 / 2,103.6 / 2,074.2; 8B 913.3 / 922.7 / 885.5, 910.1 / 921.9 /
// 885.8 (its down at 4 rows, 115 KB, loses at one CTA an SM). PEREGRINE_BF16_ADD_MMA=0 | all.
// At 5-8 rows (a batch-8 decode step) the same o / down rule holds: 1B 6,702.2 -> 7,020.5, 8B
// 1,647.5 -> 1,689.8, Qwen3-1.7B 3,679.8 -> 3,728.1 (session 31); normed bf16 products of 5-8
// rows stay on cuBLASLt: 8B 1,653.8 -> 1,616.5 there, 1B 6,739.5 -> 6,697.5, Qwen3 even.
bool bf16_auto(const MmaProduct& p) {
    static const int add_rows = env_equals("PEREGRINE_BF16_ADD_MMA", "0")     ? 0
                                : env_equals("PEREGRINE_BF16_ADD_MMA", "all") ? 2
                                                                              : 1;
    if (p.norm != nullptr) return p.n <= 4 && (p.n >= 3 || (p.epilogue == Epi::kSilu && p.k < 4096));
    return p.epilogue == Epi::kAdd && p.n >= 3 &&
           (add_rows == 2 ||
            (add_rows == 1 && static_cast<size_t>(p.n) * token_bytes(false, false, p.k) <= kMaxStagedX));
}

int g_mode[2] = {-1, -1};  // by MmaProduct::Weight: 0 off, 1 on, 2 auto, -1 the environment's
bool enabled(const MmaProduct& p) {
    static const int fp8 = env_equals("PEREGRINE_FP8_GEMV", "fma") ? 0 : 1;
    static const int bf16 = env_equals("PEREGRINE_BF16_GEMV", "fma")   ? 0
                            : env_equals("PEREGRINE_BF16_GEMV", "mma") ? 1
                                                                       : 2;
    int mode = g_mode[p.weight] >= 0 ? g_mode[p.weight] : p.weight == MmaProduct::kF8 ? fp8 : bf16;
    return mode == 2 ? p.weight == MmaProduct::kF8 || bf16_auto(p) : mode == 1;
}

// The most bytes of x a CTA stages (one CTA an SM past ~113 KB), by layout: 132 KB for hi alone
// (a non-normed x, a normed one of 5-8 rows or times FP8 weights), 120 KB for hi + lo; or
// PEREGRINE_MMA_STAGED_KB (16..200 KB) for both. 120 took the 8B's down product (k 14,336) at 4
// rows, 115 KB, which at 96 KB fell back to a quantize pass + cuBLASLt: H200, 8B FP8 decode at
// batch 4, 96 / 120 KB with o / down of 3-4 rows here (2026-11-29): 1,016.6 / 1,214.4 tok/s. 132
// takes the 1B's FP8 down (k 8,192) at 8 rows, 128 KB: 1B FP8 decode at batch 8, 120 / 132 KB
// (session 31, two rounds): 6,146.4 / 7,172.7, 6,145.8 / 7,144.7; and the 70B's FP8 normed
// products and o at 8 rows (128 KB): 70B FP8 batch 8 290.9 / 296.0 (session 32). Its normed
// products at 4 rows (128 KB, hi + lo) lose there: 70B FP8 batch 4 162.3 at 120 KB (cuBLASLt)
// against 144.9 at 132 (session 32, dummy weights, H200), hence 120 for that layout.
constexpr size_t kMaxMmaStagedX = 132 * 1024;
constexpr size_t kMaxMmaStagedLoX = 120 * 1024;
size_t staged_limit(bool lo) {
    static const size_t kb = static_cast<size_t>(std::clamp(env_int("PEREGRINE_MMA_STAGED_KB", 0), 0, 200));
    return kb >= 16 ? kb * 1024 : lo ? kMaxMmaStagedLoX : kMaxMmaStagedX;
}

}  // namespace

void set_gemv_mma(MmaProduct::Weight weight, int mode) {
    g_mode[weight] = mode;
}

void set_fp8_norm_lo(int mode) {
    g_fp8_lo = mode;
}

bool gemv_mma_takes(const MmaProduct& p) {
    const bool norm = p.norm != nullptr, f8 = p.weight == MmaProduct::kF8;
    const int seg_values = 4 * (f8 ? kVals<true> : kVals<false>);
    const bool lo = staged_lo(p);
    const size_t staged = static_cast<size_t>(p.n) * static_cast<size_t>(token_bytes(f8, lo, p.k));
    return enabled(p) && p.n >= 1 && p.n <= kMaxMmaRows && p.k > 0 && p.k % seg_values == 0 && p.m > 0 &&
           (!f8 || p.scale != nullptr) && !(p.epilogue == Epi::kAdd && norm) &&
           !(p.epilogue == Epi::kSilu && p.m % 2 != 0) && staged <= staged_limit(lo) &&
           reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 &&
           (!norm || reinterpret_cast<uintptr_t>(p.norm) % 16 == 0);
}

bool gemv_mma(const MmaProduct& p, cudaStream_t stream) {
    if (!gemv_mma_takes(p)) return false;
    if (p.weight == MmaProduct::kF8)
        dispatch_n<true>(p, stream, std::make_integer_sequence<int, kMaxMmaRows>());
    else
        dispatch_n<false>(p, stream, std::make_integer_sequence<int, kMaxMmaRows>());
    return true;
}

}  // namespace peregrine::cuda
