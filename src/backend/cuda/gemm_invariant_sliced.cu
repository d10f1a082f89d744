// gemm_invariant for small and medium n: one CTA = the kSlices slice warps of one output tile
// (TOK tokens x 8 NW weight rows), each warp streaming its own slice of k.
//
// Grid (ceil(m / (8 NW)), ceil(n / TOK)), kSlices warps. Warp s copies the 16-byte words of its
// chunks (NW weight words and the x words of its lane's token rows) into its own ring of STAGES
// chunks in shared memory with cp.async, STAGES - 1 chunks ahead. Every lane copies exactly the
// words it later reads itself, so cp.async.wait_group alone orders them: no barrier in the loop,
// and no register holds a load in flight. Words of rows past n or m, or past k, are never copied
// and read as zeros. The weight words of the first chunks are requested before pdl_wait. At the
// end the ring space holds the slice partials [kSlices][TOK][8 NW], added in slice order.
// Weights stream once per token tile (from HBM once, then L2); x comes from L2.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "backend/cuda/gemm_invariant_internal.cuh"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda::ginv {
namespace {

template <int MT, bool HALF, int NW, int STAGES>
struct SlicedConfig {
    static_assert(!HALF || MT == 1, "8 tokens: one m-tile whose upper half is zero");
    static constexpr int kTok = HALF ? 8 : 16 * MT;    // tokens per CTA
    static constexpr int kXWords = HALF ? 1 : 2 * MT;  // x words per lane and chunk: rows 16 i + g (+ 8)
    static constexpr int kWords = NW + kXWords;
    static constexpr int kCols = 8 * NW;  // weight rows per CTA
    static constexpr size_t kRing = static_cast<size_t>(kSlices) * STAGES * kWords * 32 * 16;
    static constexpr size_t kRed = static_cast<size_t>(kSlices) * kTok * kCols * sizeof(float);
    static constexpr size_t kSmem = kRing > kRed ? kRing : kRed;
};

template <int MT, bool HALF, int NW, int STAGES, bool OUT_F32>
__global__ void __launch_bounds__(kSlices * 32)
    sliced_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w, void* __restrict__ out, int n, int m,
                  int k, int chunks, int per) {
    using Cfg = SlicedConfig<MT, HALF, NW, STAGES>;
    constexpr int TOK = Cfg::kTok, XW = Cfg::kXWords, WORDS = Cfg::kWords, COLS = Cfg::kCols;
    extern __shared__ uint4 ring[];  // [kSlices warps][STAGES][WORDS][32 lanes], later the partials
    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int s = warp;  // this warp's slice
    const int w0 = blockIdx.x * COLS, t0 = blockIdx.y * TOK;
    const int c_begin = s * per, nch = max(0, min(chunks, c_begin + per) - c_begin);
    uint4* my = ring + static_cast<size_t>(warp) * STAGES * WORDS * 32 + lane;

    // This lane's rows: weight rows w0 + 8 j + g, token rows (16 i + g, 16 i + g + 8) or g.
    bool w_ok[NW], x_ok[XW];
    const uint16_t* w_row[NW];
    const uint16_t* x_row[XW];
#pragma unroll
    for (int j = 0; j < NW; ++j) {
        const int row = w0 + 8 * j + g;
        w_ok[j] = row < m;
        w_row[j] = w + static_cast<int64_t>(w_ok[j] ? row : 0) * k;
    }
#pragma unroll
    for (int xi = 0; xi < XW; ++xi) {
        const int tok = t0 + (HALF ? g : 16 * (xi >> 1) + g + 8 * (xi & 1));
        x_ok[xi] = tok < n;
        x_row[xi] = x + static_cast<int64_t>(x_ok[xi] ? tok : 0) * k;
    }
    auto copy_w = [&](int i) {
        const int kk = (c_begin + i) * kChunk + 8 * q;
        if (kk >= k) return;
        uint4* st = my + (i % STAGES) * WORDS * 32;
#pragma unroll
        for (int j = 0; j < NW; ++j)
            if (w_ok[j]) cp_async16(smem_addr(st + j * 32), w_row[j] + kk, 16);
    };
    auto copy_x = [&](int i) {
        const int kk = (c_begin + i) * kChunk + 8 * q;
        if (kk >= k) return;
        uint4* st = my + (i % STAGES) * WORDS * 32;
#pragma unroll
        for (int xi = 0; xi < XW; ++xi)
            if (x_ok[xi]) cp_async16(smem_addr(st + (NW + xi) * 32), x_row[xi] + kk, 16);
    };

    // Prologue: weights of the first STAGES - 1 chunks before the wait (they are not written by
    // earlier kernels), x after it; one commit group per chunk (the weights join the first).
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i)
        if (i < nch) copy_w(i);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < nch) copy_x(i);
        cp_async_commit();
    }

    float acc[MT][NW][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NW; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int i = 0; i < nch; ++i) {
        cp_async_wait_group<STAGES - 2>();  // this lane's words of chunk i have landed
        // Refill the stage read in the previous iteration (by this lane only, already consumed).
        if (i + STAGES - 1 < nch) {
            copy_w(i + STAGES - 1);
            copy_x(i + STAGES - 1);
        }
        cp_async_commit();
        const uint4* st = my + (i % STAGES) * WORDS * 32;
        const bool in_k = (c_begin + i) * kChunk + 8 * q < k;
        uint4 wv[NW], xv[XW];
#pragma unroll
        for (int j = 0; j < NW; ++j) wv[j] = w_ok[j] && in_k ? st[j * 32] : zero;
#pragma unroll
        for (int xi = 0; xi < XW; ++xi) xv[xi] = x_ok[xi] && in_k ? st[(NW + xi) * 32] : zero;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NW; ++j)
                chunk_mma(acc[mt][j], HALF ? xv[0] : xv[2 * mt], HALF ? zero : xv[2 * mt + 1], wv[j]);
    }
    cp_async_wait_all();
    __syncthreads();  // every warp is done with its ring: the space holds the partials now

    float* red = reinterpret_cast<float*>(ring);  // [kSlices][TOK][COLS]
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int col = 8 * j + 2 * q;
            float* r0 = red + (s * TOK + (HALF ? g : 16 * mt + g)) * COLS + col;
            r0[0] = acc[mt][j][0];
            r0[1] = acc[mt][j][1];
            if constexpr (!HALF) {
                r0[8 * COLS] = acc[mt][j][2];
                r0[8 * COLS + 1] = acc[mt][j][3];
            }
        }
    }
    __syncthreads();
    // Thread → (token, weight column); consecutive threads write consecutive columns.
    for (int idx = threadIdx.x; idx < TOK * COLS; idx += kSlices * 32) {
        const int tok = idx / COLS, col = idx - tok * COLS;
        float v = 0.0f;
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl)
            if (sl * per < chunks) v = __fadd_rn(v, red[(sl * TOK + tok) * COLS + col]);
        const int t = t0 + tok, row = w0 + col;
        if (t < n && row < m) store_out(out, OUT_F32, static_cast<int64_t>(t) * m + row, v);
    }
}

template <int MT, bool HALF, int NW, int STAGES, bool OUT_F32>
void launch_cfg(const Problem& p) {
    using Cfg = SlicedConfig<MT, HALF, NW, STAGES>;
    auto kernel = sliced_kernel<MT, HALF, NW, STAGES, OUT_F32>;
    static std::atomic<uint64_t> done{0};
    allow_smem(kernel, Cfg::kSmem, done);
    const unsigned tiles_t = static_cast<unsigned>((p.n + Cfg::kTok - 1) / Cfg::kTok);
    if (tiles_t > 65535u) fail("gemm_invariant: ", p.n, " rows exceed the sliced kernel's grid");
    const dim3 grid(static_cast<unsigned>((p.m + Cfg::kCols - 1) / Cfg::kCols), tiles_t);
    launch_pdl(kernel, grid, dim3(kSlices * 32), Cfg::kSmem, p.stream, p.x, p.w, p.out, p.n, p.m, p.k, p.chunks, p.per);
}

template <int MT, bool HALF, int NW, int STAGES>
void launch_out(const Problem& p) {
    if (p.out_f32)
        launch_cfg<MT, HALF, NW, STAGES, true>(p);
    else
        launch_cfg<MT, HALF, NW, STAGES, false>(p);
}

}  // namespace

void launch_sliced(const Problem& p, GemmInvariantPlan plan) {
    switch (plan) {
        case GemmInvariantPlan::Sliced8:  // decode: 8 weight rows, 12 chunks (6 KB of weights) ahead
            return launch_out<1, true, 1, 12>(p);
        case GemmInvariantPlan::Sliced16:
            return launch_out<1, false, 1, 8>(p);
        case GemmInvariantPlan::Sliced32:
            return launch_out<2, false, 2, 5>(p);
        case GemmInvariantPlan::Sliced64:
            return launch_out<4, false, 2, 4>(p);
        default:  // Sliced64W: 64 weight rows a CTA, x re-read 4x less
            return launch_out<4, false, 8, 3>(p);
    }
}

}  // namespace peregrine::cuda::ginv
