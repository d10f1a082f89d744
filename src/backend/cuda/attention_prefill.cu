// Prefill / chunked-prefill attention on tensor cores (FlashAttention-2 style), head_dim 64/128.
//
// Work item = (query tile of BM = 64 consecutive tokens of one sequence, query head). A tiny
// kernel first lists the tiles of every sequence with query length >= 2 in the workspace
// (int2 {seq, first query row}, heaviest tile of each sequence first); the main kernel is
// persistent (grid = min(items bound, resident CTAs)) and walks items blockIdx.x, +gridDim.x...
// so no CTA is launched for the many empty tiles a host-side bound would imply.
//
// Per item, 4 warps × 16 query rows. Q (64 x D) is staged once through shared memory into
// registers as mma A fragments; K/V tiles of BN = 64 key positions are gathered from the paged
// cache with cp.async into double-buffered shared memory (rows XOR-swizzled in 16-byte chunks
// so ldmatrix is conflict-free). S = Q·Kᵀ and O += P·V use mma.sync m16n8k16 bf16 → f32;
// online softmax in f32 (log2 units). The causal/window mask is applied only on tiles that are
// not entirely inside every row's [first, last]; warps whose rows see none of a tile skip it.
// Keys outside the union of the rows' ranges are zero-filled, never read from the cache.
//
// Dynamic shared memory: (BM + 4·BN)·D·2 bytes = 40 KB (D 64) / 80 KB (D 128); F8 +8 / +16 KB.
//
// F8 (FP8 caches): K/V tiles are read as E4M3 codes and scales and stored to the same shared
// tiles as bf16; the codes come by cp.async into a staging area (2·BN·D bytes more) while the
// previous tile is multiplied, and are converted after it (issue_kv_tile_f8 /
// convert_kv_tile_f8), or on plain loads where a head's codes are not 16-byte aligned
// (load_kv_tile_f8). The rest is the same kernel.
#include <algorithm>
#include <atomic>
#include <climits>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda::attn {
namespace {

constexpr int BM = kPrefillTileM;  // query rows per item
constexpr int BN = 64;             // keys per K/V tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kListThreads = 256;
constexpr int kListItems = 4;  // sequences per thread per pass of the list kernel

// tiles[] in order of sequences; within a sequence, the last (most keys) tile first.
__global__ void __launch_bounds__(kListThreads)
    prefill_tiles_kernel(const int32_t* __restrict__ query_start, int num_seqs, int capacity, int2* __restrict__ tiles,
                         int* __restrict__ num_tiles) {
    __shared__ int warp_sums[kListThreads / 32];
    pdl_launch_dependents();
    pdl_wait();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int carry = 0;
    for (int base = 0; base < num_seqs; base += kListThreads * kListItems) {
        int cnt[kListItems], total = 0;
#pragma unroll
        for (int j = 0; j < kListItems; ++j) {
            const int s = base + tid * kListItems + j;
            int c = 0;
            if (s < num_seqs) {
                const int q = query_start[s + 1] - query_start[s];
                c = q >= 2 ? (q + BM - 1) / BM : 0;
            }
            cnt[j] = c;
            total += c;
        }
        // Block-wide exclusive scan of `total`.
        int incl = total;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += v;
        }
        if (lane == 31) warp_sums[warp] = incl;
        __syncthreads();
        int before = 0, all = 0;
#pragma unroll
        for (int w = 0; w < kListThreads / 32; ++w) {
            before += w < warp ? warp_sums[w] : 0;
            all += warp_sums[w];
        }
        int idx = carry + before + incl - total;
#pragma unroll
        for (int j = 0; j < kListItems; ++j) {
            const int s = base + tid * kListItems + j;
            for (int k = cnt[j] - 1; k >= 0; --k, ++idx)
                if (idx < capacity) tiles[idx] = make_int2(s, k * BM);
        }
        carry += all;
        __syncthreads();  // warp_sums is rewritten by the next pass
    }
    if (tid == 0) *num_tiles = min(carry, capacity);
}

template <int D, bool F8>
__global__ void __launch_bounds__(kThreads)
    prefill_kernel(const Params p, const int2* __restrict__ tiles, const int* __restrict__ num_tiles_ptr) {
    static_assert(D == 64 || D == 128, "tensor-core prefill: head_dim 64 or 128");
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int KT = D / 16;  // k-steps of Q·Kᵀ
    constexpr int DT = D / 8;   // n-tiles of O (8 dims each)
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [BM][D]
    __nv_bfloat16* sk = sq + BM * D;                                 // [2][BN][D]
    __nv_bfloat16* sv = sk + 2 * BN * D;                             // [2][BN][D]
    uint8_t* st_k = reinterpret_cast<uint8_t*>(sv + 2 * BN * D);     // F8 staging: [BN][D] codes
    uint8_t* st_v = st_k + BN * D;                                   // same
    __shared__ int red[kWarps][4];
    pdl_launch_dependents();
    pdl_wait();  // the tile list, q, the cache and the batch arrays come from earlier work

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int num_items = *num_tiles_ptr * p.num_heads;
    // F8 with 16-byte aligned codes: tiles staged by cp.async and converted after the previous
    // tile's products (issue_kv_tile_f8); otherwise converted on plain loads (load_kv_tile_f8).
    const bool staged = F8 && p.g8.block_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.k8) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(p.v8) % 16 == 0;
    const int64_t row_stride = static_cast<int64_t>(p.num_heads) * D;

    for (int item = blockIdx.x; item < num_items; item += gridDim.x) {
        const int tile = item / p.num_heads, h = item - tile * p.num_heads;
        const int2 tl = tiles[tile];
        const int s = tl.x, qoff = tl.y;
        const int qs = p.query_start[s];
        const int rows = min(BM, p.query_start[s + 1] - qs - qoff);
        const int t0 = qs + qoff;
        const int kvh = h / p.group;
        const int ctx = p.context_lens[s];
        const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.block_stride;

        // This thread's two rows (mma C layout): r0 = warp*16 + lane/4, r1 = r0 + 8.
        int first[2], last[2];
        bool valid[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = warp * 16 + (lane >> 2) + 8 * i;
            valid[i] = r < rows;
            if (valid[i]) {
                key_range(p, p.positions[t0 + r], ctx, first[i], last[i]);
            } else {
                first[i] = 0, last[i] = -1;  // no output; excluded from the reductions
            }
        }
        const KeySpan span = reduce_key_span<kWarps>(first, last, valid, red);
        const int kmin = span.kmin, kmax = span.kmax, max_first = span.max_first, min_last = span.min_last;
        const int warp_kmin = span.warp_kmin, warp_kmax = span.warp_kmax;  // keys this warp's rows see at all

        const int kt0 = kmin == INT_MAX ? 0 : (kmin / BN) * BN;
        const int ntiles = kmax < kmin ? 0 : (kmax - kt0) / BN + 1;

        // K/V tile at key position kt into buffer `buf`; keys outside [kmin, kmax] zero-filled.
        auto load_kv = [&](int buf, int kt) {
            if constexpr (F8)
                load_kv_tile_f8<D, BN, kThreads>(p, table, kvh, kmin, kmax, kt, sk + buf * BN * D, sv + buf * BN * D);
            else
                load_kv_tile<D, BN, kThreads>(p, table, kvh, kmin, kmax, kt, smem_addr(sk + buf * BN * D),
                                              smem_addr(sv + buf * BN * D));
        };

        float o[DT][4];
#pragma unroll
        for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

        if (ntiles > 0) {
            // Q tile (rows past the sequence's queries zero-filled) + the first K/V tile.
            {
                const uint32_t q_sm = smem_addr(sq);
#pragma unroll
                for (int it = 0; it < BM * CPR / kThreads; ++it) {
                    const int idx = tid + it * kThreads;
                    const int r = idx / CPR, c = idx % CPR;
                    const bool ok = r < rows;
                    const __nv_bfloat16* src = ok ? p.q + (t0 + r) * row_stride + h * D + c * 8 : p.q;
                    cp_async16(q_sm + static_cast<uint32_t>(swz<D>(r, c) * 2), src, ok ? 16 : 0);
                }
            }
            F8Stage<D, BN, kThreads> stage;
            if (staged) {  // tile 0 converted now, tile 1's copies in flight during tile 0's products
                issue_kv_tile_f8<D, BN, kThreads>(p, table, kvh, kmin, kmax, kt0, st_k, st_v, stage);
                cp_async_commit();
                cp_async_wait_all();
                convert_kv_tile_f8<D, BN, kThreads>(st_k, st_v, stage, sk, sv);
                if (ntiles > 1) {
                    issue_kv_tile_f8<D, BN, kThreads>(p, table, kvh, kmin, kmax, kt0 + BN, st_k, st_v, stage);
                    cp_async_commit();
                }
            } else {
                load_kv(0, kt0);
                cp_async_commit();
            }

            uint32_t qf[KT][4];  // A fragments of this warp's 16 query rows
            for (int j = 0; j < ntiles; ++j) {
                const int kt = kt0 + j * BN;
                if (!staged) cp_async_wait_all();
                __syncthreads();  // tile j visible to all; everyone is done with buffer (j+1)&1
                if (!staged && j + 1 < ntiles) {
                    load_kv((j + 1) & 1, kt + BN);
                    cp_async_commit();
                }
                if (j == 0) {
#pragma unroll
                    for (int kk = 0; kk < KT; ++kk) {
                        const int r = warp * 16 + (lane & 15), c = 2 * kk + (lane >> 4);
                        ldmatrix_x4(smem_addr(sq + swz<D>(r, c)), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
                    }
                }
                if (kt <= warp_kmax && kt + BN - 1 >= warp_kmin) {  // else fully masked for this warp
                    const __nv_bfloat16* kb = sk + (j & 1) * BN * D;
                    const __nv_bfloat16* vb = sv + (j & 1) * BN * D;
                    const bool need_mask = kt < max_first || kt + BN - 1 > min_last;
                    flash_tile_step<D, BN>(qf, kb, vb, kt, need_mask, first, last, p.scale_log2, m, l, o);
                }
                if (staged && j + 1 < ntiles) {  // tile j + 1 into the other buffer, tile j + 2's copies out
                    cp_async_wait_all();
                    convert_kv_tile_f8<D, BN, kThreads>(st_k, st_v, stage, sk + ((j + 1) & 1) * BN * D,
                                                        sv + ((j + 1) & 1) * BN * D);
                    if (j + 2 < ntiles) {
                        issue_kv_tile_f8<D, BN, kThreads>(p, table, kvh, kmin, kmax, kt + 2 * BN, st_k, st_v, stage);
                        cp_async_commit();
                    }
                }
            }
        }

        // Epilogue: full row sums, normalise, store bf16 pairs (rows with no keys → zeros).
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float ll = l[i];
            ll += __shfl_xor_sync(0xffffffffu, ll, 1);
            ll += __shfl_xor_sync(0xffffffffu, ll, 2);
            const float inv = ll > 0.0f ? 1.0f / ll : 0.0f;
            const int r = warp * 16 + (lane >> 2) + 8 * i;
            if (r < rows) {
                __nv_bfloat16* dst = p.out + (t0 + r) * row_stride + h * D + 2 * (lane & 3);
#pragma unroll
                for (int d = 0; d < DT; ++d)
                    *reinterpret_cast<uint32_t*>(dst + d * 8) = pack_bf16x2(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
            }
        }
        __syncthreads();  // shared tiles and red[] are reused by the next item
    }
}

// Q, two K and two V tiles (bf16), and for FP8 the staging of one K and one V tile's codes.
constexpr size_t smem_bytes(int d, bool f8) {
    return static_cast<size_t>(BM + 4 * BN) * d * 2 + (f8 ? static_cast<size_t>(2 * BN) * d : 0);
}

// Resident CTAs per SM of prefill_kernel<D, F8> (after raising its dynamic shared memory limit),
// computed once per process and device.
template <int D, bool F8>
int prepare_kernel() {
    static std::atomic<int> cached[64];
    int dev = 0;
    PG_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>& slot = cached[dev & 63];
    int v = slot.load(std::memory_order_relaxed);
    if (v > 0) return v;
    PG_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<D, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_bytes(D, F8))));
    PG_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, prefill_kernel<D, F8>, kThreads, smem_bytes(D, F8)));
    v = std::max(v, 1);
    slot.store(v, std::memory_order_relaxed);
    return v;
}

template <int D, bool F8>
void launch_pdf(const Params& p, int tile_bound, int2* tiles, int* num_tiles, int sm_count, cudaStream_t stream) {
    const int per_sm = prepare_kernel<D, F8>();
    const int64_t items = static_cast<int64_t>(tile_bound) * p.num_heads;
    const int grid = static_cast<int>(std::min<int64_t>(items, static_cast<int64_t>(per_sm) * sm_count));
    // A plain launch, not launch_pdl: this grid is persistent (per_sm CTAs on every SM, walking
    // the tile list), and launched early its CTAs land wherever slots are free, unevenly;
    // measured on an H100, prefill attention ran 20-30% slower that way (CudaAttentionPerf).
    prefill_kernel<D, F8><<<grid, kThreads, smem_bytes(D, F8), stream>>>(p, static_cast<const int2*>(tiles),
                                                                         static_cast<const int*>(num_tiles));
    check_launch("prefill_attention");
}

template <int D>
void launch_pd(const Params& p, int tile_bound, int2* tiles, int* num_tiles, int sm_count, cudaStream_t stream) {
    if (p.k8 != nullptr)
        launch_pdf<D, true>(p, tile_bound, tiles, num_tiles, sm_count, stream);
    else
        launch_pdf<D, false>(p, tile_bound, tiles, num_tiles, sm_count, stream);
}

}  // namespace

bool prefill_supports(int head_dim) {
    return head_dim == 64 || head_dim == 128;
}

int64_t prefill_tile_bound(int num_tokens, int num_seqs, int max_query_len) {
    // Σ over sequences with q >= 2 of ceil(q / BM) <= (T + (BM - 1) * n) / BM with n <= T / 2.
    const int64_t by_len = static_cast<int64_t>(num_seqs) * ((std::max(max_query_len, 0) + BM - 1) / BM);
    const int64_t n = std::min<int64_t>(num_seqs, num_tokens / 2);
    const int64_t by_tokens = (static_cast<int64_t>(num_tokens) + (BM - 1) * n) / BM;
    return std::min(by_len, by_tokens);
}

void launch_prefill(const Params& p, int tile_bound, int2* tiles, int* num_tiles, int sm_count, cudaStream_t stream) {
    if (tile_bound <= 0) return;
    launch_pdl(prefill_tiles_kernel, dim3(1), dim3(kListThreads), 0, stream, p.query_start, p.num_seqs, tile_bound,
               tiles, num_tiles);
    check_launch("prefill_attention_tiles");
    if (p.head_dim == 64)
        launch_pd<64>(p, tile_bound, tiles, num_tiles, sm_count, stream);
    else if (p.head_dim == 128)
        launch_pd<128>(p, tile_bound, tiles, num_tiles, sm_count, stream);
    else
        fail("prefill attention: unsupported head_dim ", p.head_dim);
}

}  // namespace peregrine::cuda::attn
