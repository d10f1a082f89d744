// gguf_gemm (gguf_gemm.h): GGUF-layout products on mma.sync m16n8k16.
//
// The weight is the MMA's A operand (16 weight rows x 16 values of k), x its B operand (16
// values x 8 tokens), so a warp's accumulators are 16 weight rows x 8 tokens a tile. A CTA of 8
// warps takes 128 weight rows (a tile a warp) and up to 64 tokens (grid z: the token tiles of a
// larger product), over a range of k in blocks of 128 values, each block's codes and factors of
// those rows and x's block brought into a shared-memory stage by cp.async (several stages in
// flight). In a block, lane (g, q) of a warp (lane = 4 g + q) reads values [32 q, 32 q + 32) of
// rows g and g + 8 of each tile (one or two 16-byte chunks of codes).
// The sum over k does not depend on the order of k, only on A and B pairing the same values, so
// the MMA's k slots {2q, 2q+1, 8+2q, 9+2q} of each step take values {4s .. 4s+3} of the lane's
// own 32 (step s = 0..7): a lane builds its A fragments from the values it unpacked, with no
// exchange between lanes, and reads the matching 4 values of x for each token. Values are
// unpacked with the decode kernels' WeightChunk and rounded to bf16 as dequantize_weight rounds
// them. Up to 64 tokens (batched decode) the weight streams once; past 64 every token tile
// unpacks it again, and the kernel stays at 100-210 TF/s on an H200 where cuBLASLt reaches
// 700-770 on the matrix dequantized (from 512 rows), so the backend takes it only up to 64 rows
// by default (CudaOptions::gguf_gemm_max_rows). H200 figures and where the time goes:
// docs/PERFORMANCE.md, "GGUF products of 5-64 rows on tensor cores" and "Prefill-sized GGUF
// products".
#include "backend/cuda/gguf_gemm.h"

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "backend/cuda/weight_chunks.cuh"
#include "core/env.h"
#include "core/error.h"

namespace peregrine::cuda {

namespace {

// 8 warps of one tile, not 4 of two: H200, 8B Q4_K_M decode at batch 64 8,179.9 against 7,008.1
// tok/s (5 and 16 rows unchanged); two CTAs an SM (their registers capped for it).
constexpr int kThreads = 256;                             // 8 warps
constexpr int kTiles = 1;                                 // 16-row MMA tiles a warp
constexpr int kRowsPerCta = kThreads / 32 * 16 * kTiles;  // 128
constexpr int kBlockK = 128;                              // values of k a block: 32 a lane quad position
constexpr int kUnits = kBlockK / 8;                       // 16-byte units of x a token a block
constexpr int kMinBlocksPerSplit = 4;                     // a CTA's range of k: at least this many blocks
int g_ctas_per_sm = 0;                                    // set_gguf_gemm_ctas_per_sm

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

// 8-byte async copy global -> shared (src_bytes 0: zeros, no read).
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// A block of k (128 values) of a row as the GGUF device layouts store it: up to three segments
// (codes; the 6-bit layout's high bits; the block factors), each copied into its own region of a
// pipeline stage ([128 rows][bytes] a region), and a lane's chunks read back from there.
// Row r's codes start at w + r * row_bytes(k); its factors at factors + r * factor bytes a row.
template <int W>
struct Staged;
template <>
struct Staged<kU4> {  // 32 4-bit codes a chunk, an f16 (scale, min) pair a chunk
    static constexpr int kSegs = 2;
    __host__ __device__ static constexpr int bytes(int seg) { return seg == 0 ? 64 : 16; }
    __device__ static const char* src(const Args& a, int seg, int64_t row, int kb) {
        return seg == 0 ? static_cast<const char*>(a.w) + row * (a.k / 2) + kb * 64
                        : static_cast<const char*>(a.w_factors) + row * (a.k / 8) + kb * 16;
    }
    // Chunk j of lane quad position q (j = 0: C is 1) of a row whose segments start at seg[].
    __device__ static QuantChunk chunk(const char* const (&seg)[kSegs], int q, int) {
        return {*reinterpret_cast<const uint4*>(seg[0] + 16 * q), reinterpret_cast<const uint32_t*>(seg[1])[q]};
    }
};
template <>
struct Staged<kU6> {  // 16 low-nibble bytes + 8 high-bit bytes a chunk of 32, two f16 scales
    static constexpr int kSegs = 3;
    __host__ __device__ static constexpr int bytes(int seg) { return seg == 0 ? 64 : seg == 1 ? 32 : 16; }
    __device__ static const char* src(const Args& a, int seg, int64_t row, int kb) {
        const char* r = static_cast<const char*>(a.w) + row * (3 * a.k / 4);
        return seg == 0   ? r + kb * 64
               : seg == 1 ? r + a.k / 2 + kb * 32
                          : static_cast<const char*>(a.w_factors) + row * (a.k / 8) + kb * 16;
    }
    __device__ static Q6Chunk chunk(const char* const (&seg)[kSegs], int q, int) {
        return {*reinterpret_cast<const uint4*>(seg[0] + 16 * q), *reinterpret_cast<const uint2*>(seg[1] + 8 * q),
                reinterpret_cast<const uint32_t*>(seg[2])[q]};
    }
};
template <int B>
struct StagedI8 {  // 16 int8 codes a chunk, an f16 factor per B values
    static constexpr int kSegs = 2;
    __host__ __device__ static constexpr int bytes(int seg) { return seg == 0 ? 128 : 256 / B; }
    __device__ static const char* src(const Args& a, int seg, int64_t row, int kb) {
        return seg == 0 ? static_cast<const char*>(a.w) + row * a.k + kb * 128
                        : static_cast<const char*>(a.w_factors) + row * (2 * a.k / B) + kb * (256 / B);
    }
    // Chunk 2q + j of the block: values 32q + 16j .. + 15, factor (32q + 16j) / B.
    __device__ static QuantChunk chunk(const char* const (&seg)[kSegs], int q, int j) {
        return {*reinterpret_cast<const uint4*>(seg[0] + 32 * q + 16 * j),
                reinterpret_cast<const uint16_t*>(seg[1])[(32 * q + 16 * j) / B]};
    }
};
template <>
struct Staged<kI8B32> : StagedI8<32> {};
template <>
struct Staged<kI8B16> : StagedI8<16> {};

template <int W>
constexpr int kRowBlockBytes = [] {
    int b = 0;
    for (int s = 0; s < Staged<W>::kSegs; ++s) b += Staged<W>::bytes(s);
    return b;
}();
// A pipeline stage: the CTA's 128 rows' block of weight (kRowsPerCta * kRowBlockBytes) then x's
// block for 8 NT tokens (16-byte units, x_slot order).
template <int W, int NT>
constexpr int kStageBytes = kRowsPerCta* kRowBlockBytes<W> + NT * 8 * kBlockK * 2;
// Stages in flight: as many as fit ~112 KB (two CTAs an SM), 2 to 6.
template <int W, int NT>
constexpr int kStages = std::clamp((112 << 10) / kStageBytes<W, NT>, 2, 6);

// out[i] = v (beta 0) or beta * out[i] + v, out f32 or bf16 (rounded to nearest even).
__device__ __forceinline__ void store_out(void* out, bool out_f32, int64_t i, float v, float beta) {
    if (out_f32) {
        float* o = static_cast<float*>(out) + i;
        *o = beta != 0.0f ? beta * *o + v : v;
    } else {
        auto* o = static_cast<__nv_bfloat16*>(out) + i;
        *o = __float2bfloat16_rn(beta != 0.0f ? beta * __bfloat162float(*o) + v : v);
    }
}

// NT 8-token tiles (8 NT tokens a CTA). Grid: (row blocks of 128, splits of k, token tiles);
// blocks_per_split blocks of k a CTA. One split: out gets the epilogue (beta, dtype) here;
// several: partials [split][n][m].
// Blocks of weight and x stream through kStages shared-memory stages by cp.async, so a CTA keeps
// kStages - 1 blocks (~10-35 KB) in flight while it multiplies one.
template <int W, int NT>
__global__ void __launch_bounds__(kThreads, 2)
    gguf_gemm_kernel(const Args a, int n, int blocks_per_split, float beta, float* __restrict__ partials) {
    using WC = WeightChunk<W>;
    using SB = Staged<W>;
    constexpr int P = WC::kPieces;  // 8-value pieces a chunk
    constexpr int S = kStages<W, NT>;
    extern __shared__ __align__(16) char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int m = a.m, k = a.k;
    const int cta_row0 = static_cast<int>(blockIdx.x) * kRowsPerCta;
    const int kb0 = static_cast<int>(blockIdx.y) * blocks_per_split;
    const int kb1 = min(kb0 + blocks_per_split, k / kBlockK);
    const int t0 = static_cast<int>(blockIdx.z) * 8 * NT;  // the CTA's first token
    const int nt = min(8 * NT, n - t0);                    // and its tokens
    auto stage_at = [&](int s) { return smem + s * kStageBytes<W, NT>; };

    // Block kb of the CTA's rows (zeros past m) into stage s: each segment's rows in 16-byte
    // units (8-byte ones for segments of 8 bytes a row), consecutive threads along a row.
    auto stage_w = [&](int kb, int s) {
        char* region = stage_at(s);
#pragma unroll
        for (int seg = 0; seg < SB::kSegs; ++seg) {
            const int bytes = SB::bytes(seg), unit = bytes >= 16 ? 16 : 8, per_row = bytes / unit;
            for (int i = threadIdx.x; i < kRowsPerCta * per_row; i += kThreads) {
                const int r = i / per_row, u = i % per_row, row = cta_row0 + r;
                const bool in = row < m;
                const char* src = SB::src(a, seg, in ? row : 0, kb) + u * unit;
                const uint32_t dst = smem_addr(region + r * bytes + u * unit);
                if (unit == 16)
                    cp_async16(dst, src, in ? 16 : 0);
                else
                    cp_async8(dst, src, in ? 8 : 0);
            }
            region += kRowsPerCta * bytes;
        }
    };
    // Block kb of the tile's x (tokens past nt as zeros) into stage s.
    auto stage_x = [&](int kb, int s) {
        const auto* x = static_cast<const bf16_t*>(a.x) + static_cast<int64_t>(t0) * k;
        const uint32_t base = smem_addr(stage_at(s) + kRowsPerCta * kRowBlockBytes<W>);
        for (int i = threadIdx.x; i < NT * 8 * kUnits; i += kThreads) {
            const int t = i / kUnits, u = i % kUnits;
            const bool in = t < nt;
            const bf16_t* src = in ? x + static_cast<int64_t>(t) * k + kb * kBlockK + 8 * u : x;
            cp_async16(base + 16 * (t * kUnits + x_slot(t, u)), src, in ? 16 : 0);
        }
    };

    float acc[kTiles][NT][4] = {};
    // The first stages' weights load while the kernel before finishes (weights are constant
    // during a step); x and every write wait for it. Group s holds stage s's x (group 0 also
    // every early weight block), so waiting for group s finds stage s whole.
    pdl_launch_dependents();
    for (int s = 0; s < S - 1; ++s)
        if (kb0 + s < kb1) stage_w(kb0 + s, s);
    pdl_wait();
    for (int s = 0; s < S - 1; ++s) {
        if (kb0 + s < kb1) stage_x(kb0 + s, s);
        cp_async_commit();
    }
    for (int kb = kb0; kb < kb1; ++kb) {
        const int i = kb - kb0, s = i % S;
        cp_async_wait_group<S - 2>();
        __syncthreads();  // stage s is whole for every thread; stage (i - 1) % S is free
        if (kb + S - 1 < kb1) {
            stage_w(kb + S - 1, (i + S - 1) % S);
            stage_x(kb + S - 1, (i + S - 1) % S);
        }
        cp_async_commit();  // one group an iteration, empty or not, keeps the counting uniform
        const char* wst = stage_at(s);
        const uint4* xst = reinterpret_cast<const uint4*>(wst + kRowsPerCta * kRowBlockBytes<W>);
        // Segment starts of row r (of the CTA's 128) in this stage.
        auto segs = [&](int r, const char*(&seg)[SB::kSegs]) {
            const char* region = wst;
#pragma unroll
            for (int sg = 0; sg < SB::kSegs; ++sg) {
                seg[sg] = region + r * SB::bytes(sg);
                region += kRowsPerCta * SB::bytes(sg);
            }
        };
#pragma unroll
        for (int pp = 0; pp < 4; ++pp) {  // the lane's values 8 pp .. 8 pp + 7: two MMA steps
            uint32_t frag[kTiles][2][4];  // [tile][step][A fragment]
#pragma unroll
            for (int t = 0; t < kTiles; ++t) {
                const int r = warp * 16 * kTiles + 16 * t + g;  // rows r and r + 8 of the CTA's
                const char* lo_seg[SB::kSegs];
                const char* hi_seg[SB::kSegs];
                segs(r, lo_seg);
                segs(r + 8, hi_seg);
                float lo[8], hi[8];
                WC::unpack(SB::chunk(lo_seg, q, pp / P), pp % P, lo);
                WC::unpack(SB::chunk(hi_seg, q, pp / P), pp % P, hi);
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    frag[t][st][0] = pack_bf16(lo[4 * st], lo[4 * st + 1]);
                    frag[t][st][1] = pack_bf16(hi[4 * st], hi[4 * st + 1]);
                    frag[t][st][2] = pack_bf16(lo[4 * st + 2], lo[4 * st + 3]);
                    frag[t][st][3] = pack_bf16(hi[4 * st + 2], hi[4 * st + 3]);
                }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int tok = 8 * j + g;
                const uint4 b = xst[tok * kUnits + x_slot(tok, 4 * q + pp)];  // x values 8 pp .. 8 pp + 7
#pragma unroll
                for (int t = 0; t < kTiles; ++t) {
                    mma_bf16_16816(acc[t][j], frag[t][0], b.x, b.y);
                    mma_bf16_16816(acc[t][j], frag[t][1], b.z, b.w);
                }
            }
        }
    }
    cp_async_wait_all();
    // acc[t][j] = rows (g, g, g + 8, g + 8) of tile t x tokens (2q, 2q + 1, 2q, 2q + 1) of tile j.
    const int row0 = cta_row0 + warp * 16 * kTiles;
    const bool split = gridDim.y > 1;
    float* part = partials + static_cast<int64_t>(blockIdx.y) * n * m;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + 16 * t + g + 8 * (e >> 1), tok = 8 * j + 2 * q + (e & 1);
                if (row >= m || tok >= nt) continue;
                const int64_t i = static_cast<int64_t>(t0 + tok) * m + row;
                if (split)
                    part[i] = acc[t][j][e];
                else
                    store_out(a.out, a.out_f32, i, acc[t][j][e], beta);
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
        store_out(out, out_f32, i, s, beta);
    }
}

template <int W, int NT>
void launch_nt(const Args& a, int n, dim3 grid, int blocks_per_split, float beta, float* partials,
               cudaStream_t stream) {
    constexpr int smem = kStages<W, NT> * kStageBytes<W, NT>;
    static std::atomic<uint64_t> sized{0};  // devices this kernel may take `smem` on (past 48 KB: opt-in)
    int device = 0;
    PG_CUDA_CHECK(cudaGetDevice(&device));
    if (!(sized.load() >> device & 1)) {
        PG_CUDA_CHECK(cudaFuncSetAttribute(gguf_gemm_kernel<W, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        sized.fetch_or(uint64_t{1} << device);
    }
    launch_pdl(gguf_gemm_kernel<W, NT>, grid, dim3(kThreads), smem, stream, a, n, blocks_per_split, beta, partials);
}

template <int W>
void launch_kind(const Args& a, int n, dim3 grid, int blocks_per_split, float beta, float* partials,
                 cudaStream_t stream) {
    if (n <= 16)
        launch_nt<W, 2>(a, n, grid, blocks_per_split, beta, partials, stream);
    else if (n <= 32)
        launch_nt<W, 4>(a, n, grid, blocks_per_split, beta, partials, stream);
    else
        launch_nt<W, 8>(a, n, grid, blocks_per_split, beta, partials, stream);
}

int ctas_per_sm() {
    if (g_ctas_per_sm > 0) return g_ctas_per_sm;
    static const int env = std::max(1, env_int("PEREGRINE_GGUF_GEMM_CTAS", 2));
    return env;
}

// PEREGRINE_GGUF_GEMM_SPLITS=ceil: splits of k rounded up to the target (measurement knob).
bool splits_round_up() {
    static const bool up = env_equals("PEREGRINE_GGUF_GEMM_SPLITS", "ceil");
    return up;
}

}  // namespace

void set_gguf_gemm_ctas_per_sm(int ctas) {
    g_ctas_per_sm = ctas;
}

bool gguf_gemm_supported(GemvWeight w, int n, int m, int k, const void* x) {
    return w.kind > GemvWeight::kF8 && w.factors != nullptr && n >= 1 && m >= 1 && k >= kBlockK && k % kBlockK == 0 &&
           reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void gguf_gemm(const bf16_t* x, GemvWeight w, void* out, bool out_f32, float beta, int n, int m, int k, float* partials,
               size_t partial_elems, cudaStream_t stream) {
    if (!gguf_gemm_supported(w, n, m, k, x)) fail("gguf_gemm: unsupported product n ", n, " m ", m, " k ", k);
    const Args a{x, nullptr, 0.0f, w.data, nullptr, w.factors, out, out_f32, m, k};
    // Split k until the grid has about ctas_per_sm CTAs an SM, keeping each range at least
    // kMinBlocksPerSplit blocks long and the partials within their buffer (none: one split).
    // Rounded down (PEREGRINE_GGUF_GEMM_SPLITS=ceil: up, as before), so a grid does not end with a
    // second wave of a few CTAs: the 8B's q|k|v (48 row blocks) took 6 splits, 288 CTAs for 264
    // slots, now 5 (240); o and down 9 (288), now 8. H200, 8B Q4_K_M decode tok/s, up / down:
    // batch 5 957.5 / 992.2, 16 2,948.3 / 3,103.8, 64 8,029.3 / 8,578.8 (2026-11-29, one call).
    const int row_blocks = (m + kRowsPerCta - 1) / kRowsPerCta, blocks = k / kBlockK;
    const int token_tiles = (n + kGgufGemmMaxRows - 1) / kGgufGemmMaxRows;
    const int64_t ctas = static_cast<int64_t>(row_blocks) * token_tiles;
    const int64_t target = static_cast<int64_t>(ctas_per_sm()) * sm_count();
    const int64_t want = splits_round_up() ? (target + ctas - 1) / ctas : target / ctas;
    int64_t splits = std::clamp<int64_t>(want, 1, std::max(1, blocks / kMinBlocksPerSplit));
    splits = std::clamp<int64_t>(static_cast<int64_t>(partial_elems / (static_cast<size_t>(n) * m)), 1, splits);
    if (partials == nullptr) splits = 1;
    const int per = static_cast<int>((blocks + splits - 1) / splits);
    splits = (blocks + per - 1) / per;
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(splits),
                    static_cast<unsigned>(token_tiles));
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
