// gemm_invariant for large n (prefill): BT tokens x BW weights per CTA, WT x WW warps, through
// a cp.async pipeline of STAGES 32-wide k tiles shared by the CTA. Every warp runs all of k for
// its (BT / WT) x (BW / WW) sub-tile in chunk order and folds its slice sums (__fadd_rn, slice
// order) at each slice end, so each element follows the canonical order of gemm_invariant.cu.
#include <algorithm>
#include <atomic>
#include <climits>

#include "backend/cuda/gemm_invariant_internal.cuh"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda::ginv {
namespace {

// ---- tiled: 1-D grid of (token tile, weight tile), WT x WW warps -----------------------------------
// Shared memory per stage: [BT + BW rows][4 words of 16 bytes] (x rows, then w rows), 64 bytes per
// row: the 8 lanes of a quarter-warp read rows r, r+1 x 4 words = 128 contiguous bytes (no bank
// conflicts) and consecutive threads fill consecutive words.
// A stage holds CPS chunks (one barrier per stage). TOT_SMEM: the slice sums accumulate in
// shared memory (thread-private float4s after the pipeline) instead of registers, which leaves
// room for 64 x 64 warp tiles.
template <int BT, int BW, int WT, int WW, int STAGES, int CPS, bool TOT_SMEM>
struct TiledConfig {
    static constexpr int kThreads = WT * WW * 32;
    static constexpr int kRows = BT + BW;
    static constexpr size_t kPipe = static_cast<size_t>(STAGES) * CPS * kRows * 64;
    static constexpr size_t kSmem = kPipe + (TOT_SMEM ? static_cast<size_t>(BT) * BW * sizeof(float) : 0);
};

template <int BT, int BW, int WT, int WW, int STAGES, int CPS, bool TOT_SMEM, bool OUT_F32>
__global__ void __launch_bounds__(WT* WW * 32)
    tiled_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w, void* __restrict__ out, int n, int m,
                 int k, int chunks, int per, int tiles_t, int tiles_w, bool pairs) {
    constexpr int T = WT * WW * 32;
    constexpr int TM = BT / WT, TN = BW / WW;  // warp tile: tokens x weights
    constexpr int MT = TM / 16, NT = TN / 8;   // mma tiles per warp
    constexpr int ROWS = BT + BW;
    static_assert(TM % 16 == 0 && TN % 8 == 0, "warp tile of whole mma tiles");
    static_assert((BT * 4) % T == 0 && (BW * 4) % T == 0, "whole 16-byte words per thread");
    extern __shared__ uint4 smem[];  // [STAGES * CPS slots][ROWS][4]
    pdl_launch_dependents();

    // Raster: groups of kGroup weight tiles; inside a group the weight tile changes fastest, so
    // the CTAs of one wave share a few weight tiles and a band of token tiles in L2.
    constexpr int kGroup = 8;
    const int bid = blockIdx.x;
    const int group = bid / (kGroup * tiles_t);
    const int first_w = group * kGroup;
    const int gw = min(kGroup, tiles_w - first_w);
    const int in_group = bid - group * kGroup * tiles_t;
    const int t0 = (in_group / gw) * BT, w0 = (first_w + in_group % gw) * BW;

    const int tid = threadIdx.x;
    // Chunk c into slot (stage * CPS + c % CPS); chunks past the end copy nothing.
    auto load_x = [&](int slot, int c) {
        if (c >= chunks) return;
        uint4* base = smem + slot * ROWS * 4;
#pragma unroll
        for (int i = 0; i < BT * 4 / T; ++i) {
            const int idx = tid + i * T, r = idx >> 2, ch = idx & 3;
            const int kk = c * kChunk + ch * 8, t = t0 + r;
            const bool ok = t < n && kk < k;
            cp_async16(smem_addr(base + idx), ok ? x + static_cast<int64_t>(t) * k + kk : x, ok ? 16 : 0);
        }
    };
    auto load_w = [&](int slot, int c) {
        if (c >= chunks) return;
        uint4* base = smem + slot * ROWS * 4 + BT * 4;
#pragma unroll
        for (int i = 0; i < BW * 4 / T; ++i) {
            const int idx = tid + i * T, r = idx >> 2, ch = idx & 3;
            const int kk = c * kChunk + ch * 8, row = w0 + r;
            const bool ok = row < m && kk < k;
            cp_async16(smem_addr(base + idx), ok ? w + static_cast<int64_t>(row) * k + kk : w, ok ? 16 : 0);
        }
    };

    // Prologue: weight words of the first STAGES-1 stages before the wait, x words after it. The
    // weight copies join the first commit group, which only makes that group wait for more.
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st)
#pragma unroll
        for (int cc = 0; cc < CPS; ++cc) load_w(st * CPS + cc, st * CPS + cc);
    pdl_wait();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
#pragma unroll
        for (int cc = 0; cc < CPS; ++cc) load_x(st * CPS + cc, st * CPS + cc);
        cp_async_commit();
    }

    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int wt = warp / WW, ww = warp % WW;
    // total: registers, or [MT * NT][T] float4 in shared memory past the pipeline (thread-private).
    float part[MT][NT][4], total[TOT_SMEM ? 1 : MT][TOT_SMEM ? 1 : NT][4];
    float4* tot = reinterpret_cast<float4*>(smem + STAGES * CPS * ROWS * 4) + tid;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
            if constexpr (TOT_SMEM)
                tot[(i * NT + j) * T] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            else
                total[i][j][0] = total[i][j][1] = total[i][j][2] = total[i][j][3] = 0.0f;
        }

    const int stages = (chunks + CPS - 1) / CPS;
    for (int st = 0; st < stages; ++st) {
        cp_async_wait_group<STAGES - 2>();
        __syncthreads();  // stage st visible to all; everyone is done with the stage refilled below
        const int ns = st + STAGES - 1;
        if (ns < stages) {
#pragma unroll
            for (int cc = 0; cc < CPS; ++cc) {
                load_w((ns % STAGES) * CPS + cc, ns * CPS + cc);
                load_x((ns % STAGES) * CPS + cc, ns * CPS + cc);
            }
        }
        cp_async_commit();
#pragma unroll
        for (int cc = 0; cc < CPS; ++cc) {
            const int c = st * CPS + cc;
            if (c >= chunks) break;  // CTA-uniform
            const uint4* xs = smem + ((st % STAGES) * CPS + cc) * ROWS * 4;
            const uint4* ws = xs + BT * 4;
            uint4 a[MT][2], b[NT];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                a[i][0] = xs[(wt * TM + 16 * i + g) * 4 + q];
                a[i][1] = xs[(wt * TM + 16 * i + g + 8) * 4 + q];
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) b[j] = ws[(ww * TN + 8 * j + g) * 4 + q];
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) chunk_mma(part[i][j], a[i][0], a[i][1], b[j]);

            if ((c + 1) % per == 0 || c + 1 == chunks) {  // slice end: total += P_s (CTA-uniform)
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        if constexpr (TOT_SMEM) {
                            float4 v = tot[(i * NT + j) * T];
                            v.x = __fadd_rn(v.x, part[i][j][0]), v.y = __fadd_rn(v.y, part[i][j][1]);
                            v.z = __fadd_rn(v.z, part[i][j][2]), v.w = __fadd_rn(v.w, part[i][j][3]);
                            tot[(i * NT + j) * T] = v;
                        } else {
#pragma unroll
                            for (int e = 0; e < 4; ++e) total[i][j][e] = __fadd_rn(total[i][j][e], part[i][j][e]);
                        }
#pragma unroll
                        for (int e = 0; e < 4; ++e) part[i][j][e] = 0.0f;
                    }
            }
        }  // chunks of the stage
    }
    cp_async_wait_all();  // no copy may land after the CTA exits (only empty groups are left)

    // Epilogue: element pairs (token, 2q..2q+1) straight from the mma layout.
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int t = t0 + wt * TM + 16 * i + g + 8 * h;
            if (t >= n) continue;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int col = w0 + ww * TN + 8 * j + 2 * q;
                float v0, v1;
                if constexpr (TOT_SMEM) {
                    const float4 v = tot[(i * NT + j) * T];
                    v0 = h ? v.z : v.x, v1 = h ? v.w : v.y;
                } else {
                    v0 = total[i][j][2 * h], v1 = total[i][j][2 * h + 1];
                }
                const int64_t idx = static_cast<int64_t>(t) * m + col;
                if (pairs && col + 1 < m) {
                    if constexpr (OUT_F32) {
                        *reinterpret_cast<float2*>(static_cast<float*>(out) + idx) = make_float2(v0, v1);
                    } else {
                        const uint32_t packed =
                            static_cast<uint32_t>(bf16_bits(v0)) | (static_cast<uint32_t>(bf16_bits(v1)) << 16);
                        *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + idx) = packed;
                    }
                } else {
                    if (col < m) store_out(out, OUT_F32, idx, v0);
                    if (col + 1 < m) store_out(out, OUT_F32, idx + 1, v1);
                }
            }
        }
    }
}

template <int BT, int BW, int WT, int WW, int STAGES, int CPS, bool TOT_SMEM, bool OUT_F32>
void launch_cfg(const Problem& p) {
    using Cfg = TiledConfig<BT, BW, WT, WW, STAGES, CPS, TOT_SMEM>;
    auto kernel = tiled_kernel<BT, BW, WT, WW, STAGES, CPS, TOT_SMEM, OUT_F32>;
    static std::atomic<uint64_t> done{0};
    allow_smem(kernel, Cfg::kSmem, done);
    const int tiles_t = (p.n + BT - 1) / BT, tiles_w = (p.m + BW - 1) / BW;
    const int64_t ctas = static_cast<int64_t>(tiles_t) * tiles_w;
    if (ctas > INT32_MAX) fail("gemm_invariant: ", p.n, " x ", p.m, " is too large a product");
    const uintptr_t align = OUT_F32 ? 8 : 4;
    const bool pairs = p.m % 2 == 0 && reinterpret_cast<uintptr_t>(p.out) % align == 0;
    launch_pdl(kernel, dim3(static_cast<unsigned>(ctas)), dim3(Cfg::kThreads), Cfg::kSmem, p.stream, p.x, p.w, p.out,
               p.n, p.m, p.k, p.chunks, p.per, tiles_t, tiles_w, pairs);
}

template <int BT, int BW, int WT, int WW, int STAGES, int CPS, bool TOT_SMEM>
void launch_out(const Problem& p) {
    if (p.out_f32)
        launch_cfg<BT, BW, WT, WW, STAGES, CPS, TOT_SMEM, true>(p);
    else
        launch_cfg<BT, BW, WT, WW, STAGES, CPS, TOT_SMEM, false>(p);
}

}  // namespace

void launch_tiled(const Problem& p, GemmInvariantPlan plan) {
    switch (plan) {
        case GemmInvariantPlan::Tiled32:
            return launch_out<32, 32, 2, 2, 8, 1, false>(p);
        case GemmInvariantPlan::Tiled64:
            return launch_out<64, 64, 2, 2, 6, 1, false>(p);
        case GemmInvariantPlan::Tiled128:
            return launch_out<128, 128, 2, 4, 4, 1, false>(p);
        case GemmInvariantPlan::TiledWide4:  // 4 stages of one chunk (224 KB)
            return launch_out<128, 256, 2, 4, 4, 1, true>(p);
        case GemmInvariantPlan::TiledWideK64:  // 2 stages of two chunks: half the barriers (224 KB)
            return launch_out<128, 256, 2, 4, 2, 2, true>(p);
        default:  // TiledWide: 128 x 256, 64 x 64 warp tiles, slice sums in shared memory (200 KB)
            return launch_out<128, 256, 2, 4, 3, 1, true>(p);
    }
}

}  // namespace peregrine::cuda::ginv
