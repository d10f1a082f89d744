// Batch-invariant products: out[n, m] = x[n, k] · w[m, k]ᵀ, bf16 in, f32 accumulation on tensor
// cores, with ONE order of k for every output element, whatever n is and wherever a row sits in
// the batch: a token's result never depends on what else is in the batch.
//
// The canonical computation of element (token t, weight row r):
//   k is cut into C = ceil(k / 32) chunks of 32 values (zeros past k), and the chunks into
//   kSlices = 8 slices of per = ceil(C / 8) consecutive chunks. In a slice one f32 accumulator,
//   starting at 0, takes two mma.sync m16n8k16 per chunk in chunk order; the slice sums P_s are
//   then added as ((0 + P_0) + P_1) + ... + P_7 (__fadd_rn), empty slices skipped.
//   In a chunk, lane (g, q) of a warp (lane = 4 g + q) holds the 8 values [32c + 8q, +8) of its
//   row as one 16-byte word; the first mma takes values 0-3 of every lane's word, the second
//   values 4-7 (a fixed permutation of k inside the chunk, the same for x and w), so one 16-byte
//   load per row and lane feeds both, from global or shared memory alike (no ldmatrix).
//   x is the A operand (16 tokens as rows), w the B operand (8 weight rows as columns) in every
//   kernel, so each element sees the same operands in the same places of the instruction; its
//   bits depend on its x row and w row only (mma.sync computes every element independently).
//   The 8 slices are what lets a decode product spread over many warps without split-K across
//   CTAs: the slices of one output are the 8 warps of one CTA.
//
// Kernel families (all give the same bits; auto_plan picks by shape, GemmInvariantPlan forces):
//   skinny  decode, n <= 16 (below): a CTA = the 8 slice warps of 8 weight rows (R = 1) or 16
//           (R = 2); each warp streams its slice's weight words straight into registers, the next
//           group of chunks loading while the current one multiplies. Also the fallback for
//           k % 8 != 0 or unaligned operands (then 8 values are loaded element by element).
//   sliced  (gemm_invariant_sliced.cu) the same CTA shape for 8..64 tokens and up to 64 weight
//           rows, each warp streaming its slice through its own deep cp.async ring (no barrier
//           in the loop): decode with long slices (k >= 8192) and n up to 64-256.
//   tiled   large n (gemm_invariant_tiled.cu): BT tokens x BW weights per CTA through a shared
//           cp.async pipeline of 32-wide k tiles; every warp runs all of k for its sub-tile and
//           folds its slice sums (registers or shared memory) at each slice end.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/gemm_invariant_internal.cuh"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda {
namespace ginv {
namespace {

constexpr int kUnroll = 8;  // skinny, 8 tokens: chunks per load group (16 tokens: 4 per group)

// The 8 values [kk, kk + 8) of a row (zeros past k or when !ok). VEC: one 16-byte load (row
// 16-byte aligned, k % 8 == 0); else eight 2-byte loads. NC: read-only path (weights only:
// activations are written by earlier kernels, which may still run under PDL before pdl_wait).
template <bool VEC, bool NC>
__device__ __forceinline__ uint4 load8(const uint16_t* row, int kk, int k, bool ok) {
    if constexpr (VEC) {
        if (!ok || kk >= k) return make_uint4(0, 0, 0, 0);
        const uint4* p = reinterpret_cast<const uint4*>(row + kk);
        if constexpr (NC) return __ldg(p);
        return *p;
    } else {
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int k0 = kk + 2 * i;
            const uint32_t lo = ok && k0 < k ? (NC ? __ldg(row + k0) : row[k0]) : 0u;
            const uint32_t hi = ok && k0 + 1 < k ? (NC ? __ldg(row + k0 + 1) : row[k0 + 1]) : 0u;
            v[i] = lo | (hi << 16);
        }
        return make_uint4(v[0], v[1], v[2], v[3]);
    }
}

// ---- skinny: grid (ceil(m / 8R), ceil(n / TOK)), R x kSlices warps --------------------------------
template <int TOK, int R, bool VEC, bool OUT_F32>
__global__ void __launch_bounds__(R* kSlices * 32)
    skinny_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w, void* __restrict__ out, int n, int m,
                  int k, int chunks, int per) {
    static_assert(TOK == 8 || TOK == 16, "one mma row tile: 8 (upper half zero) or 16 tokens");
    __shared__ float red[R][kSlices][TOK][8];  // slice partials of each row group
    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s = warp % kSlices, rg = warp / kSlices;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * (8 * R) + rg * 8;  // this warp's first weight row
    const int t0 = blockIdx.y * TOK;
    const int c_begin = s * per, c_end = min(chunks, c_begin + per);

    const bool w_ok = row0 + g < m, a_ok = t0 + g < n, b_ok = TOK == 16 && t0 + g + 8 < n;
    const uint16_t* wr = w + static_cast<int64_t>(w_ok ? row0 + g : 0) * k;
    const uint16_t* xa_row = x + static_cast<int64_t>(a_ok ? t0 + g : 0) * k;
    const uint16_t* xb_row = x + static_cast<int64_t>(b_ok ? t0 + g + 8 : 0) * k;

    // Weight words of U chunks per lane: the next U chunks' weights load while the current ones
    // multiply (in registers, so no load sinks into a branch); x words (L2-resident) load at the
    // top of each group.
    constexpr int U = TOK == 8 ? kUnroll : kUnroll / 2;
    auto load_w = [&](uint4(&r)[U], int cb) {
#pragma unroll
        for (int u = 0; u < U; ++u) r[u] = load8<VEC, true>(wr, (cb + u) * kChunk + 8 * q, k, w_ok);
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int full = (c_end - c_begin) / U;  // whole groups of U chunks (an empty slice: none)
    uint4 wcur[U], wnxt[U];
    if (full > 0) load_w(wcur, c_begin);  // weights are not written by earlier kernels: before the wait
    pdl_wait();
    for (int it = 0; it < full; ++it) {
        const int cb = c_begin + it * U;
        if (it + 1 < full) load_w(wnxt, cb + U);
        uint4 xa[U], xb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int kk = (cb + u) * kChunk + 8 * q;
            xa[u] = load8<VEC, false>(xa_row, kk, k, a_ok);
            xb[u] = TOK == 16 ? load8<VEC, false>(xb_row, kk, k, b_ok) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) chunk_mma(acc, xa[u], xb[u], wcur[u]);
#pragma unroll
        for (int u = 0; u < U; ++u) wcur[u] = wnxt[u];
    }
    for (int c = c_begin + max(full, 0) * U; c < c_end; ++c) {  // the slice's last < U chunks
        const int kk = c * kChunk + 8 * q;
        const uint4 wv = load8<VEC, true>(wr, kk, k, w_ok);
        const uint4 xa = load8<VEC, false>(xa_row, kk, k, a_ok);
        const uint4 xb = TOK == 16 ? load8<VEC, false>(xb_row, kk, k, b_ok) : make_uint4(0, 0, 0, 0);
        chunk_mma(acc, xa, xb, wv);
    }

    red[rg][s][g][2 * q] = acc[0];
    red[rg][s][g][2 * q + 1] = acc[1];
    if constexpr (TOK == 16) {
        red[rg][s][g + 8][2 * q] = acc[2];
        red[rg][s][g + 8][2 * q + 1] = acc[3];
    }
    __syncthreads();
    // Thread → (row group, token, weight column); consecutive threads write consecutive columns.
    for (int idx = threadIdx.x; idx < R * TOK * 8; idx += R * kSlices * 32) {
        const int r = idx / (TOK * 8), rem = idx - r * TOK * 8, tok = rem >> 3, col = rem & 7;
        float v = 0.0f;
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl)
            if (sl * per < chunks) v = __fadd_rn(v, red[r][sl][tok][col]);
        const int row = blockIdx.x * (8 * R) + r * 8 + col, t = t0 + tok;
        if (row < m && t < n) store_out(out, OUT_F32, static_cast<int64_t>(t) * m + row, v);
    }
}

}  // namespace

void launch_skinny(const Problem& p, int row_groups, bool vec) {
    const int tok = p.n <= 8 ? 8 : 16;
    const unsigned tiles_t = static_cast<unsigned>((p.n + tok - 1) / tok);
    if (tiles_t > 65535u) fail("gemm_invariant: ", p.n, " rows exceed the skinny kernel's grid");
    const int R = row_groups == 1 ? 1 : 2;
    const dim3 grid(static_cast<unsigned>((p.m + 8 * R - 1) / (8 * R)), tiles_t), block(R * kSlices * 32);
    auto go = [&](auto kernel) {
        launch_pdl(kernel, grid, block, 0, p.stream, p.x, p.w, p.out, p.n, p.m, p.k, p.chunks, p.per);
    };
    // Instantiations: tokens 8 / 16, R 1 / 2, vectorised or not, f32 or bf16 out.
    auto pick_out = [&](auto tok_c, auto r_c, auto vec_c) {
        constexpr int T = decltype(tok_c)::value, RR = decltype(r_c)::value;
        constexpr bool V = decltype(vec_c)::value;
        if (p.out_f32)
            go(skinny_kernel<T, RR, V, true>);
        else
            go(skinny_kernel<T, RR, V, false>);
    };
    auto pick_vec = [&](auto tok_c, auto r_c) {
        if (vec)
            pick_out(tok_c, r_c, std::true_type{});
        else
            pick_out(tok_c, r_c, std::false_type{});
    };
    auto pick_r = [&](auto tok_c) {
        if (R == 1)
            pick_vec(tok_c, std::integral_constant<int, 1>{});
        else
            pick_vec(tok_c, std::integral_constant<int, 2>{});
    };
    if (tok == 8)
        pick_r(std::integral_constant<int, 8>{});
    else
        pick_r(std::integral_constant<int, 16>{});
}

}  // namespace ginv

namespace {

std::atomic<int> g_plan{static_cast<int>(GemmInvariantPlan::Auto)};

// The automatic choice (every plan gives the same bits; this is about speed only), from the
// H200 timings of GemmInvariantPerf.Report: register streaming for decode unless each slice is
// long (per >= 32 chunks, k >= 8192), where the deep cp.async rings win; sliced kernels up to 64
// tokens (and beyond while the tiled grids would be too small to fill the GPU); tiled above.
GemmInvariantPlan auto_plan(int n, int m, int per) {
    using P = GemmInvariantPlan;
    if (n <= 16) return per < 32 ? P::SkinnyR1 : n <= 8 ? P::Sliced8 : P::Sliced16;
    if (n <= 64) return m > 4096 ? P::Sliced64W : n <= 32 ? P::Sliced32 : P::Sliced64;
    const int64_t t = (n + 127) / 128;
    if (t * ((m + 255) / 256) >= 128) return P::TiledWideK64;  // CTAs of the 128 x 256 grid
    if (t * ((m + 127) / 128) >= 96) return P::Tiled128;
    return P::Sliced64W;
}

}  // namespace

void set_gemm_invariant_plan(GemmInvariantPlan plan) {
    g_plan.store(static_cast<int>(plan));
}

void gemm_invariant(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int n, int m, int k,
                    cudaStream_t stream) {
    if (n <= 0 || m <= 0) return;
    if (k <= 0) fail("gemm_invariant: k must be positive, got ", k);
    ginv::Problem p{x, w, out, out_f32, n, m, k, 0, 0, stream};
    p.chunks = (k + ginv::kChunk - 1) / ginv::kChunk;
    p.per = (p.chunks + ginv::kSlices - 1) / ginv::kSlices;
    // 16-byte words need k % 8 == 0 and 16-byte aligned operands; otherwise the skinny kernel's
    // element-wise loads (same words, same bits, slower) serve every n.
    const bool vec = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
    GemmInvariantPlan plan = static_cast<GemmInvariantPlan>(g_plan.load(std::memory_order_relaxed));
    if (plan == GemmInvariantPlan::Auto) plan = auto_plan(n, m, p.per);
    if (!vec && plan != GemmInvariantPlan::SkinnyR2) plan = GemmInvariantPlan::SkinnyR1;
    switch (plan) {
        case GemmInvariantPlan::SkinnyR1:
        case GemmInvariantPlan::SkinnyR2:
            ginv::launch_skinny(p, plan == GemmInvariantPlan::SkinnyR1 ? 1 : 2, vec);
            break;
        case GemmInvariantPlan::Sliced8:
        case GemmInvariantPlan::Sliced16:
        case GemmInvariantPlan::Sliced32:
        case GemmInvariantPlan::Sliced64:
        case GemmInvariantPlan::Sliced64W:
            ginv::launch_sliced(p, plan);
            break;
        default:
            ginv::launch_tiled(p, plan);
            break;
    }
    check_launch("gemm_invariant");
}

}  // namespace peregrine::cuda
