// gguf_gemm (gguf_gemm.h): GGUF-layout products of up to 64 rows on mma.sync m16n8k16.
//
// The weight is the MMA's A operand (16 weight rows x 16 values of k), x its B operand (16
// values x 8 tokens), so a warp's accumulators are 16 weight rows x 8 tokens a tile. A CTA of 4
// warps takes 128 weight rows (2 tiles a warp) and a range of k in blocks of 128 values. In a
// block, lane (g, q) of a warp (lane = 4 g + q) reads values [32 q, 32 q + 32) of rows g and g + 8
// of each tile: one or two 16-byte chunks of codes, so a lane quad reads 64 contiguous bytes of a
// row. The sum over k does not depend on the order of k, only on A and B pairing the same
// values, so the MMA's k slots {2q, 2q+1, 8+2q, 9+2q} of each step take values {4s .. 4s+3} of the
// lane's own 32 (step s = 0..7): a lane builds its A fragments from the values it unpacked, with
// no exchange between lanes, and reads the matching 4 values of x for each token from shared
// memory. Values are unpacked with the decode kernels' WeightChunk and rounded to bf16 as
// dequantize_weight rounds them.
#include "backend/cuda/gguf_gemm.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "backend/cuda/weight_chunks.cuh"
#include "core/env.h"
#include "core/error.h"

namespace peregrine::cuda {

namespace {

constexpr int kThreads = 128;                 // 4 warps
constexpr int kTiles = 2;                     // 16-row MMA tiles a warp
constexpr int kRowsPerCta = 4 * 16 * kTiles;  // 128
constexpr int kBlockK = 128;                  // values of k a block: 32 a lane quad position
constexpr int kUnits = kBlockK / 8;           // 16-byte units of x a token a block
constexpr int kMinBlocksPerSplit = 4;         // a CTA's range of k: at least this many blocks
int g_ctas_per_sm = 0;                        // set_gguf_gemm_ctas_per_sm

// x's unit u of a block (values 8u .. 8u+7) for token t sits in shared slot x_slot(t, u) of the
// token's 16. Lane (g, q) reads unit 4q + p of token 8j + g (the same p in the whole warp); the
// XOR puts the 8 lanes of each quarter warp (two g, four q) in 8 different 16-byte bank groups.
__device__ __forceinline__ int x_slot(int t, int u) {
    return u ^ ((u >> 3) | ((t & 1) << 1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // round to nearest even, as to_bf16
    return *reinterpret_cast<const uint32_t*>(&v);
}

// NT 8-token tiles (n <= 8 NT). Grid: (row blocks of 128, splits of k); blocks_per_split blocks
// of k a CTA. One split: out gets the epilogue (beta, dtype) here; several: partials [split][n][m].
template <int W, int NT>
__global__ void __launch_bounds__(kThreads)
    gguf_gemm_kernel(const Args a, int n, int blocks_per_split, float beta, float* __restrict__ partials) {
    using WC = WeightChunk<W>;
    using Chunk = typename WC::Chunk;
    constexpr int P = WC::kPieces;  // 8-value pieces a chunk
    constexpr int C = 4 / P;        // chunks of a row a lane reads a block (32 values)
    __shared__ __align__(16) uint4 xs[2][NT * 8][kUnits];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int m = a.m, k = a.k;
    const int row0 = static_cast<int>(blockIdx.x) * kRowsPerCta + warp * 16 * kTiles;
    const int kb0 = static_cast<int>(blockIdx.y) * blocks_per_split;
    const int kb1 = min(kb0 + blocks_per_split, k / kBlockK);

    // Chunks of rows row0 + 16 t + 8 h + g (zeros past m) holding values [32 q, 32 q + 32) of block kb.
    auto load_w = [&](int kb, Chunk(&c)[kTiles][2][C]) {
        const int first = (kb * kBlockK + 32 * q) / (8 * P);
#pragma unroll
        for (int t = 0; t < kTiles; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + 16 * t + 8 * h + g;
#pragma unroll
                for (int j = 0; j < C; ++j) c[t][h][j] = row < m ? WC::load(a, row, first + j) : Chunk{};
            }
    };
    // Block kb of x into buffer `buf` (tokens past n as zeros), one cp.async group.
    auto stage_x = [&](int kb, int buf) {
        const auto* x = static_cast<const bf16_t*>(a.x);
        for (int i = threadIdx.x; i < NT * 8 * kUnits; i += kThreads) {
            const int t = i / kUnits, u = i % kUnits;
            const bool in = t < n;
            const bf16_t* src = in ? x + static_cast<int64_t>(t) * k + kb * kBlockK + 8 * u : x;
            cp_async16(smem_addr(&xs[buf][t][x_slot(t, u)]), src, in ? 16 : 0);
        }
        cp_async_commit();
    };

    float acc[kTiles][NT][4] = {};
    // The first block's weights load while the kernel before finishes (weights are constant
    // during a step); x and every write wait for it.
    pdl_launch_dependents();
    Chunk next[kTiles][2][C];
    if (kb0 < kb1) load_w(kb0, next);
    pdl_wait();
    if (kb0 < kb1) stage_x(kb0, 0);
    for (int kb = kb0; kb < kb1; ++kb) {
        const int buf = (kb - kb0) & 1;
        Chunk cur[kTiles][2][C];
#pragma unroll
        for (int t = 0; t < kTiles; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < C; ++j) cur[t][h][j] = next[t][h][j];
        if (kb + 1 < kb1) {
            load_w(kb + 1, next);
            stage_x(kb + 1, buf ^ 1);
            cp_async_wait_group<1>();
        } else {
            cp_async_wait_group<0>();
        }
        __syncthreads();  // every thread's copies of block kb have landed
#pragma unroll
        for (int pp = 0; pp < 4; ++pp) {  // the lane's values 8 pp .. 8 pp + 7: two MMA steps
            uint32_t frag[kTiles][2][4];  // [tile][step][A fragment]
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
                float lo[8], hi[8];  // rows g and g + 8
                WC::unpack(cur[t][0][pp / P], pp % P, lo);
                WC::unpack(cur[t][1][pp / P], pp % P, hi);
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    frag[t][s][0] = pack_bf16(lo[4 * s], lo[4 * s + 1]);
                    frag[t][s][1] = pack_bf16(hi[4 * s], hi[4 * s + 1]);
                    frag[t][s][2] = pack_bf16(lo[4 * s + 2], lo[4 * s + 3]);
                    frag[t][s][3] = pack_bf16(hi[4 * s + 2], hi[4 * s + 3]);
                }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int tok = 8 * j + g;
                const uint4 b = xs[buf][tok][x_slot(tok, 4 * q + pp)];  // x values 8 pp .. 8 pp + 7
#pragma unroll
                for (int t = 0; t < kTiles; ++t) {
                    mma_bf16_16816(acc[t][j], frag[t][0], b.x, b.y);
                    mma_bf16_16816(acc[t][j], frag[t][1], b.z, b.w);
                }
            }
        }
        __syncthreads();  // buffer `buf` is refilled by the next iteration's stage_x
    }
    // acc[t][j] = rows (g, g, g + 8, g + 8) of tile t x tokens (2q, 2q + 1, 2q, 2q + 1) of tile j.
    const bool split = gridDim.y > 1;
    float* part = partials + static_cast<int64_t>(blockIdx.y) * n * m;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + 16 * t + g + 8 * (e >> 1), tok = 8 * j + 2 * q + (e & 1);
                if (row >= m || tok >= n) continue;
                const int64_t i = static_cast<int64_t>(tok) * m + row;
                if (split) {
                    part[i] = acc[t][j][e];
                } else if (a.out_f32) {
                    float* o = static_cast<float*>(a.out) + i;
                    *o = beta != 0.0f ? beta * *o + acc[t][j][e] : acc[t][j][e];
                } else {
                    auto* o = static_cast<__nv_bfloat16*>(a.out) + i;
                    const float v = beta != 0.0f ? beta * __bfloat162float(*o) + acc[t][j][e] : acc[t][j][e];
                    *o = __float2bfloat16_rn(v);
                }
            }
}

// out[i] = (beta * out[i]) + the splits' partial sums, added in split order.
__global__ void gguf_gemm_finish(const float* __restrict__ partials, int splits, int64_t count, void* out, bool out_f32,
                                 float beta) {
    pdl_launch_dependents();
    pdl_wait();
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float s = partials[i];
        for (int p = 1; p < splits; ++p) s += partials[p * count + i];
        if (out_f32) {
            float* o = static_cast<float*>(out) + i;
            *o = beta != 0.0f ? beta * *o + s : s;
        } else {
            auto* o = static_cast<__nv_bfloat16*>(out) + i;
            *o = __float2bfloat16_rn(beta != 0.0f ? beta * __bfloat162float(*o) + s : s);
        }
    }
}

template <int W>
void launch_kind(const Args& a, int n, dim3 grid, int blocks_per_split, float beta, float* partials,
                 cudaStream_t stream) {
    if (n <= 16)
        launch_pdl(gguf_gemm_kernel<W, 2>, grid, dim3(kThreads), 0, stream, a, n, blocks_per_split, beta, partials);
    else if (n <= 32)
        launch_pdl(gguf_gemm_kernel<W, 4>, grid, dim3(kThreads), 0, stream, a, n, blocks_per_split, beta, partials);
    else
        launch_pdl(gguf_gemm_kernel<W, 8>, grid, dim3(kThreads), 0, stream, a, n, blocks_per_split, beta, partials);
}

int ctas_per_sm() {
    if (g_ctas_per_sm > 0) return g_ctas_per_sm;
    static const int env = std::max(1, env_int("PEREGRINE_GGUF_GEMM_CTAS", 3));
    return env;
}

}  // namespace

void set_gguf_gemm_ctas_per_sm(int ctas) {
    g_ctas_per_sm = ctas;
}

bool gguf_gemm_supported(GemvWeight w, int n, int m, int k, const void* x, size_t partial_elems) {
    return w.kind > GemvWeight::kF8 && w.factors != nullptr && n >= 1 && n <= kGgufGemmMaxRows && m >= 1 &&
           k >= kBlockK && k % kBlockK == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           static_cast<size_t>(n) * static_cast<size_t>(m) <= partial_elems;
}

void gguf_gemm(const bf16_t* x, GemvWeight w, void* out, bool out_f32, float beta, int n, int m, int k, float* partials,
               size_t partial_elems, cudaStream_t stream) {
    if (!gguf_gemm_supported(w, n, m, k, x, partial_elems))
        fail("gguf_gemm: unsupported product n ", n, " m ", m, " k ", k, " (", partial_elems, " partial floats)");
    const Args a{x, nullptr, 0.0f, w.data, nullptr, w.factors, out, out_f32, m, k};
    // Split k until the grid has about ctas_per_sm CTAs an SM, keeping each range at least
    // kMinBlocksPerSplit blocks long and the partials within their buffer.
    const int row_blocks = (m + kRowsPerCta - 1) / kRowsPerCta, blocks = k / kBlockK;
    const int64_t target = static_cast<int64_t>(ctas_per_sm()) * sm_count();
    int64_t splits =
        std::clamp<int64_t>((target + row_blocks - 1) / row_blocks, 1, std::max(1, blocks / kMinBlocksPerSplit));
    splits = std::min<int64_t>(splits, static_cast<int64_t>(partial_elems / (static_cast<size_t>(n) * m)));
    const int per = static_cast<int>((blocks + splits - 1) / splits);
    splits = (blocks + per - 1) / per;
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits));
    switch (w.kind) {
        case GemvWeight::kI8B32:
            launch_kind<GemvWeight::kI8B32>(a, n, grid, per, beta, partials, stream);
            break;
        case GemvWeight::kI8B16:
            launch_kind<GemvWeight::kI8B16>(a, n, grid, per, beta, partials, stream);
            break;
        case GemvWeight::kU6:
            launch_kind<GemvWeight::kU6>(a, n, grid, per, beta, partials, stream);
            break;
        default:
            launch_kind<GemvWeight::kU4>(a, n, grid, per, beta, partials, stream);
            break;
    }
    check_launch("gguf_gemm");
    if (splits > 1) {
        const int64_t count = static_cast<int64_t>(n) * m;
        const unsigned ctas = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 4 * sm_count()));
        launch_pdl(gguf_gemm_finish, dim3(ctas), dim3(256), 0, stream, partials, static_cast<int>(splits), count, out,
                   out_f32, beta);
        check_launch("gguf_gemm_finish");
    }
}

}  // namespace peregrine::cuda
