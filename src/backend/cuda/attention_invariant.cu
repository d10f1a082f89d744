// Batch-invariant paged attention (AttentionArgs::batch_invariant) on tensor cores, head_dim 64
// and 128: every query token's output is a function of its own q, position and cached keys and
// values only, whatever else is in the batch, however its prompt was chunked, and whether its
// sequence has one query token this step or many.
//
// The canonical computation of query token t, head h (keys [first, last] from key_range):
//   keys are cut at absolute positions into partitions of kInvariantPartition keys, each of
//   whole aligned tiles of BN = 64 keys. Partition j's partial (m_j, l_j, o_j) is the
//   FlashAttention-2 online softmax over its tiles in key order, from (-inf, 0, 0): S = q·Kᵀ
//   and O += P·V on mma.sync m16n8k16 (each element depends only on its own row and column),
//   the row max and row sum over the tile's 64 keys in a fixed lane order. Tiles wholly masked
//   for a row leave its state as it was. The partials are folded in partition order into
//   (M, L, A) by fold_weights / fold_value (explicitly rounded, never contracted), and
//   out = A · (1 / L). Nothing depends on which rows share a tile or a CTA.
//
// Work: a tile is up to 64 (token, head) rows of one sequence that share a kv head: tt =
// 64 / group consecutive query tokens x the group's query heads, so each K/V tile is read once
// per kv head. An item is (tile, kv head). It folds all of its partitions itself, or (a
// one-token tile, i.e. a decode token, while the workspace has room) the token's partitions
// become one item each that writes its partial, and a combine kernel folds them: the same
// operations on the same values in the same order, so the same bits, with more CTAs at work.
// A one-CTA planner lists the items on the device, so the launches depend only on the batch's
// scalar sizes (graph-safe); the main kernel is persistent over the list.
//
// FP8 caches: the K/V tiles come through load_kv_tile_f8 (codes times scales, rounded to bf16 in
// shared memory); a token's values depend only on its own cache entries, so the computation above
// is unchanged and as batch-invariant.
//
// Workspace (attention.cu lays it out): split [num_seqs] int2 {first slot, partitions} (0
// partitions: not split), the item count and list [capacity] int4 {seq, first query token
// of the tile in the sequence, partition (-1: all), slot}, and the partials ml [pcap, H, 2],
// acc [pcap, H, D] f32 of the split tokens.
#include <algorithm>
#include <atomic>
#include <climits>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda::attn {
namespace {

constexpr int BM = kInvariantTileRows;  // (token, head) rows per tile
constexpr int BN = 64;                  // keys per K/V tile
constexpr int kP = kInvariantPartition;
static_assert(kP % BN == 0, "partitions of whole key tiles");
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kPlanThreads = 256;
// K/V tiles in flight: 3 buffers for head_dim 64 (3 CTAs an SM fit), 2 for 128 (2 CTAs an SM).
template <int D>
constexpr int kv_stages() {
    return D == 64 ? 3 : 2;
}

// ---- the fold of partition partials (shared by the main and the combine kernel) ----------------
// M' = max(M, m_j); a = 2^(M - M'), b = 2^(m_j - M'); then X' = X·a + x_j·b for X in {L, A[d]}.
// Only for a non-empty partial (m_j > -inf). Rounded intrinsics: no FMA contraction, so both
// kernels perform exactly these operations.
__device__ __forceinline__ void fold_weights(float& M, float mj, float& a, float& b) {
    const float mn = fmaxf(M, mj);
    a = exp2f(M - mn);  // M == -inf (nothing folded yet): 0
    b = exp2f(mj - mn);
    M = mn;
}
__device__ __forceinline__ float fold_value(float acc, float part, float a, float b) {
    return __fadd_rn(__fmul_rn(acc, a), __fmul_rn(part, b));
}
__device__ __forceinline__ float finish_inv(float L) {
    return L > 0.0f ? 1.0f / L : 0.0f;
}
__device__ __forceinline__ __nv_bfloat16 finish(float A, float inv) {
    return __float2bfloat16_rn(__fmul_rn(A, inv));
}
__device__ __forceinline__ uint32_t bf16_pair(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&lo)) |
           (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
}

// Block-wide exclusive prefix sum of v over kPlanThreads threads; total = sum of all.
__device__ __forceinline__ int block_exclusive_scan(int v, int& total, int* warp_sums) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int incl = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += u;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    int before = 0;
    total = 0;
#pragma unroll
    for (int w = 0; w < kPlanThreads / 32; ++w) {
        before += w < warp ? warp_sums[w] : 0;
        total += warp_sums[w];
    }
    __syncthreads();  // warp_sums is rewritten by the next scan
    return before + incl - v;
}

// ---- planner: one CTA ---------------------------------------------------------------------------
// Per sequence: a one-token sequence whose key range spans J >= 2 partitions is split (J items,
// slots [slot, slot + J)) while the running total of such requests stays within pcap; every
// other sequence gets ceil(q / tt) tile items (its last tile first: the heaviest starts first).
__global__ void __launch_bounds__(kPlanThreads)
    invariant_plan_kernel(const Params p, const int tt, const int pcap, const int capacity, int4* __restrict__ items,
                          int* __restrict__ num_items, int2* __restrict__ split) {
    __shared__ int warp_sums[kPlanThreads / 32];
    pdl_launch_dependents();
    pdl_wait();
    int carry_items = 0, carry_parts = 0;
    for (int base = 0; base < p.num_seqs; base += kPlanThreads) {
        const int s = base + static_cast<int>(threadIdx.x);
        int want = 0, tiles = 0, j0 = 0;
        if (s < p.num_seqs) {
            const int qs = p.query_start[s], q = p.query_start[s + 1] - qs;
            tiles = q > 0 ? (q + tt - 1) / tt : 0;
            if (q == 1) {
                int first, last;
                key_range(p, p.positions[qs], p.context_lens[s], first, last);
                if (last >= first) {
                    j0 = first / kP;
                    const int J = last / kP - j0 + 1;
                    want = J >= 2 ? J : 0;
                }
            }
        }
        int all_parts = 0, all_items = 0;
        const int pre_parts = carry_parts + block_exclusive_scan(want, all_parts, warp_sums);
        const bool is_split = want > 0 && pre_parts + want <= pcap;
        const int n_items = is_split ? want : tiles;
        int idx = carry_items + block_exclusive_scan(n_items, all_items, warp_sums);
        if (s < p.num_seqs) {
            if (is_split) {
                for (int jj = 0; jj < want; ++jj, ++idx)
                    if (idx < capacity) items[idx] = make_int4(s, 0, j0 + jj, pre_parts + jj);
            } else {
                for (int k = tiles - 1; k >= 0; --k, ++idx)
                    if (idx < capacity) items[idx] = make_int4(s, k * tt, -1, -1);
            }
            split[s] = is_split ? make_int2(pre_parts, want) : make_int2(0, 0);
        }
        carry_parts += all_parts;
        carry_items += all_items;
    }
    if (threadIdx.x == 0) *num_items = min(carry_items, capacity);
}

// ---- main kernel: persistent over items x kv heads, 4 warps x 16 rows -----------------------------
template <int D, bool F8>
__global__ void __launch_bounds__(kThreads)
    invariant_kernel(const Params p, const int4* __restrict__ items, const int* __restrict__ num_items_ptr,
                     const int tt, float* __restrict__ ws_ml, float* __restrict__ ws_acc) {
    static_assert(D == 64 || D == 128, "tensor-core attention: head_dim 64 or 128");
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int KT = D / 16;  // k-steps of Q·Kᵀ
    constexpr int DT = D / 8;   // n-tiles of O (8 dims each)
    constexpr int S = kv_stages<D>();
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [BM][D]
    __nv_bfloat16* sk = sq + BM * D;                                 // [S][BN][D]
    __nv_bfloat16* sv = sk + S * BN * D;                             // [S][BN][D]
    float* sa = reinterpret_cast<float*>(sv + S * BN * D);           // [DT * 4][kThreads]: A, thread-private
    __shared__ int red[kWarps][4];

    pdl_launch_dependents();
    pdl_wait();  // the item list, q, the cache and the batch arrays come from earlier work
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int num_items = *num_items_ptr * p.num_kv_heads;
    const int64_t row_stride = static_cast<int64_t>(p.num_heads) * D;

    for (int item = blockIdx.x; item < num_items; item += gridDim.x) {
        const int li = item / p.num_kv_heads, kvh = item - li * p.num_kv_heads;
        const int4 it = items[li];
        const int s = it.x, jsel = it.z, slot = it.w;
        const int qs = p.query_start[s];
        const int ntok = min(tt, p.query_start[s + 1] - qs - it.y);
        const int rows = ntok * p.group;  // valid rows: (token r / group, head r % group)
        const int t0 = qs + it.y;
        const int ctx = p.context_lens[s];
        const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.block_stride;

        // This thread's two rows (mma C layout): r = warp*16 + lane/4 + 8i.
        int first[2], last[2], tok[2], head[2];
        bool valid[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = warp * 16 + (lane >> 2) + 8 * i;
            valid[i] = r < rows;
            tok[i] = valid[i] ? t0 + r / p.group : t0;
            head[i] = kvh * p.group + (valid[i] ? r % p.group : 0);
            if (valid[i]) {
                key_range(p, p.positions[tok[i]], ctx, first[i], last[i]);
                if (jsel >= 0) first[i] = max(first[i], jsel * kP), last[i] = min(last[i], jsel * kP + kP - 1);
            } else {
                first[i] = 0, last[i] = -1;
            }
        }
        const KeySpan span = reduce_key_span<kWarps>(first, last, valid, red);
        const int kmin = span.kmin, kmax = span.kmax, max_first = span.max_first, min_last = span.min_last;
        const int warp_kmin = span.warp_kmin, warp_kmax = span.warp_kmax;
        const int kt0 = kmin == INT_MAX ? 0 : (kmin / BN) * BN;
        const int ntiles = kmax < kmin ? 0 : (kmax - kt0) / BN + 1;

        auto load_kv = [&](int buf, int kt) {
            if constexpr (F8)
                load_kv_tile_f8<D, BN, kThreads>(p, table, kvh, kmin, kmax, kt, sk + buf * BN * D, sv + buf * BN * D);
            else
                load_kv_tile<D, BN, kThreads>(p, table, kvh, kmin, kmax, kt, smem_addr(sk + buf * BN * D),
                                              smem_addr(sv + buf * BN * D));
        };

        // Partition state (m, l: this lane's share of the row sum, o) and the fold (M, L, A in sa).
        float o[DT][4];
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
#pragma unroll
        for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
        if (jsel < 0) {
#pragma unroll
            for (int e = 0; e < DT * 4; ++e) sa[e * kThreads + tid] = 0.0f;
        }
        // Folds the partition state into (M, L, A) and clears it. Every lane of the warp calls it.
        auto fold = [&]() {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float ll = l[i];
                ll += __shfl_xor_sync(0xffffffffu, ll, 1);
                ll += __shfl_xor_sync(0xffffffffu, ll, 2);
                if (m[i] != -INFINITY) {
                    float a, b;
                    fold_weights(M[i], m[i], a, b);
                    L[i] = fold_value(L[i], ll, a, b);
#pragma unroll
                    for (int d = 0; d < DT; ++d)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            float& A = sa[(d * 4 + 2 * i + c) * kThreads + tid];
                            A = fold_value(A, o[d][2 * i + c], a, b);
                        }
                }
                m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
                for (int d = 0; d < DT; ++d) o[d][2 * i] = o[d][2 * i + 1] = 0.0f;
            }
        };

        if (ntiles > 0) {
            {  // Q rows (token r / group, head r % group), rows past `rows` zero-filled
                const uint32_t q_sm = smem_addr(sq);
#pragma unroll
                for (int i = 0; i < BM * CPR / kThreads; ++i) {
                    const int idx = tid + i * kThreads;
                    const int r = idx / CPR, c = idx % CPR;
                    const bool ok = r < rows;
                    const __nv_bfloat16* src = ok ? p.q + static_cast<int64_t>(t0 + r / p.group) * row_stride +
                                                        static_cast<int64_t>(kvh * p.group + r % p.group) * D + c * 8
                                                  : p.q;
                    cp_async16(q_sm + static_cast<uint32_t>(swz<D>(r, c) * 2), src, ok ? 16 : 0);
                }
            }
            load_kv(0, kt0);
            cp_async_commit();  // group 0: Q and tile 0; then one group per tile
#pragma unroll
            for (int st = 1; st < S - 1; ++st) {
                if (st < ntiles) load_kv(st, kt0 + st * BN);
                cp_async_commit();
            }

            uint32_t qf[KT][4];
            for (int j = 0; j < ntiles; ++j) {
                const int kt = kt0 + j * BN;
                cp_async_wait_group<S - 2>();
                __syncthreads();  // tile j visible to all; everyone is done with buffer (j-1) % S
                if (j + S - 1 < ntiles) load_kv((j + S - 1) % S, kt + (S - 1) * BN);
                cp_async_commit();
                if (j == 0) {
#pragma unroll
                    for (int kk = 0; kk < KT; ++kk) {
                        const int r = warp * 16 + (lane & 15), c = 2 * kk + (lane >> 4);
                        ldmatrix_x4(smem_addr(sq + swz<D>(r, c)), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
                    }
                }
                if (jsel < 0 && j > 0 && kt % kP == 0) fold();            // a new partition starts (CTA-uniform)
                if (kt > warp_kmax || kt + BN - 1 < warp_kmin) continue;  // masked for all of this warp's rows
                const __nv_bfloat16* kb = sk + (j % S) * BN * D;
                const __nv_bfloat16* vb = sv + (j % S) * BN * D;

                const bool need_mask = kt < max_first || kt + BN - 1 > min_last;
                flash_tile_step<D, BN>(qf, kb, vb, kt, need_mask, first, last, p.scale_log2, m, l, o);
            }
        }

        if (jsel >= 0) {
            // One partition's partial per row: (m, l, o) → slot (s, jsel) of head h.
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float ll = l[i];
                ll += __shfl_xor_sync(0xffffffffu, ll, 1);
                ll += __shfl_xor_sync(0xffffffffu, ll, 2);
                if (!valid[i]) continue;
                const int64_t r = static_cast<int64_t>(slot) * p.num_heads + head[i];
                if ((lane & 3) == 0) ws_ml[2 * r] = m[i], ws_ml[2 * r + 1] = ll;
                float* dst = ws_acc + r * D + 2 * (lane & 3);
#pragma unroll
                for (int d = 0; d < DT; ++d)
                    *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[d][2 * i], o[d][2 * i + 1]);
            }
        } else {
            fold();  // the last partition
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                if (!valid[i]) continue;
                const float inv = finish_inv(L[i]);
                __nv_bfloat16* dst = p.out + static_cast<int64_t>(tok[i]) * row_stride +
                                     static_cast<int64_t>(head[i]) * D + 2 * (lane & 3);
#pragma unroll
                for (int d = 0; d < DT; ++d) {
                    const float a0 = sa[(d * 4 + 2 * i) * kThreads + tid],
                                a1 = sa[(d * 4 + 2 * i + 1) * kThreads + tid];
                    *reinterpret_cast<uint32_t*>(dst + d * 8) = bf16_pair(finish(a0, inv), finish(a1, inv));
                }
            }
        }
        __syncthreads();  // shared tiles and red[] are reused by the next item
    }
}

// ---- combine: one warp per (sequence, query head) of the split sequences ---------------------------
template <int D>
__global__ void __launch_bounds__(128)
    invariant_combine_kernel(const Params p, const int2* __restrict__ split, const float* __restrict__ ws_ml,
                             const float* __restrict__ ws_acc) {
    constexpr int PER = D / 32;  // dims per lane: d = lane + 32 i
    pdl_launch_dependents();
    pdl_wait();
    const int gw = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int s = gw / p.num_heads, h = gw - s * p.num_heads;
    if (s >= p.num_seqs) return;
    const int2 sp = split[s];
    if (sp.y == 0) return;  // not split: the main kernel wrote the output
    float M = -INFINITY, L = 0.0f, A[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) A[i] = 0.0f;
    for (int jj = 0; jj < sp.y; ++jj) {
        const int64_t r = static_cast<int64_t>(sp.x + jj) * p.num_heads + h;
        const float mj = ws_ml[2 * r], lj = ws_ml[2 * r + 1];
        if (mj == -INFINITY) continue;
        float a, b;
        fold_weights(M, mj, a, b);
        L = fold_value(L, lj, a, b);
#pragma unroll
        for (int i = 0; i < PER; ++i) A[i] = fold_value(A[i], ws_acc[r * D + lane + 32 * i], a, b);
    }
    const float inv = finish_inv(L);
    __nv_bfloat16* out = p.out + static_cast<int64_t>(p.query_start[s]) * p.num_heads * D + static_cast<int64_t>(h) * D;
#pragma unroll
    for (int i = 0; i < PER; ++i) out[lane + 32 * i] = finish(A[i], inv);
}

template <int D>
constexpr size_t smem_bytes() {
    return static_cast<size_t>(BM + 2 * kv_stages<D>() * BN) * D * 2 +
           static_cast<size_t>(D / 8) * 4 * kThreads * sizeof(float);
}

// Resident CTAs per SM of invariant_kernel<D, F8> (after raising its shared memory limit), once
// per process and device.
template <int D, bool F8>
int prepare_kernel() {
    static std::atomic<int> cached[64];
    int dev = 0;
    PG_CUDA_CHECK(cudaGetDevice(&dev));
    std::atomic<int>& slot = cached[dev & 63];
    int v = slot.load(std::memory_order_relaxed);
    if (v > 0) return v;
    PG_CUDA_CHECK(cudaFuncSetAttribute(invariant_kernel<D, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_bytes<D>())));
    // All of the unified L1 / shared memory as shared: 3 (head_dim 64) or 2 (128) CTAs an SM.
    PG_CUDA_CHECK(cudaFuncSetAttribute(invariant_kernel<D, F8>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    PG_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, invariant_kernel<D, F8>, kThreads, smem_bytes<D>()));
    v = std::max(v, 1);
    slot.store(v, std::memory_order_relaxed);
    return v;
}

template <int D, bool F8>
void launch_main(const Params& p, const InvariantWorkspace& w, int tt, int sm_count, cudaStream_t stream) {
    const int per_sm = prepare_kernel<D, F8>();
    const int64_t items = static_cast<int64_t>(w.item_capacity) * p.num_kv_heads;
    const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(items, int64_t{per_sm} * sm_count)));
    launch_pdl(invariant_kernel<D, F8>, dim3(grid), dim3(kThreads), smem_bytes<D>(), stream, p,
               static_cast<const int4*>(w.items), static_cast<const int*>(w.num_items), tt, w.ml, w.acc);
}

template <int D>
void launch_d(const Params& p, const InvariantWorkspace& w, int tt, int sm_count, cudaStream_t stream) {
    if (p.k8 != nullptr)
        launch_main<D, true>(p, w, tt, sm_count, stream);
    else
        launch_main<D, false>(p, w, tt, sm_count, stream);
    check_launch("invariant_attention");
    const int64_t warps = static_cast<int64_t>(p.num_seqs) * p.num_heads;
    launch_pdl(invariant_combine_kernel<D>, dim3(static_cast<unsigned>((warps + 3) / 4)), dim3(128), 0, stream, p,
               static_cast<const int2*>(w.split), static_cast<const float*>(w.ml), static_cast<const float*>(w.acc));
    check_launch("invariant_attention_combine");
}

}  // namespace

bool invariant_supports(int head_dim, int group) {
    return (head_dim == 64 || head_dim == 128) && group >= 1 && group <= BM;
}

int invariant_tokens_per_tile(int group) {
    return std::max(1, BM / std::max(group, 1));
}

int64_t invariant_item_bound(int num_tokens, int num_seqs, int max_query_len, int tt, int pcap) {
    // Tiles: Σ ceil(q / tt) <= min(seqs · ceil(max_q / tt), (T + (tt - 1) · seqs) / tt); split
    // tokens add at most pcap items (their partitions) in place of their one tile.
    const int64_t by_len = static_cast<int64_t>(num_seqs) * ((std::max(max_query_len, 0) + tt - 1) / tt);
    const int64_t by_tokens = (static_cast<int64_t>(num_tokens) + static_cast<int64_t>(tt - 1) * num_seqs) / tt;
    return std::min(by_len, by_tokens) + pcap;
}

void launch_invariant(const Params& p, const InvariantWorkspace& w, int sm_count, cudaStream_t stream) {
    if (w.item_capacity <= 0) return;
    const int tt = invariant_tokens_per_tile(p.group);
    launch_pdl(invariant_plan_kernel, dim3(1), dim3(kPlanThreads), 0, stream, p, tt, w.pcap, w.item_capacity, w.items,
               w.num_items, w.split);
    check_launch("invariant_attention_plan");
    if (p.head_dim == 64)
        launch_d<64>(p, w, tt, sm_count, stream);
    else if (p.head_dim == 128)
        launch_d<128>(p, w, tt, sm_count, stream);
    else
        fail("invariant attention: unsupported head_dim ", p.head_dim);
}

}  // namespace peregrine::cuda::attn
