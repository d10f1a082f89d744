// Decode attention (one query token per sequence): split-KV flash-decoding with GQA grouping.
//
// Grid (splits, num_kv_heads * head_chunks, num_seqs), W warps. One CTA reads one kv head's
// keys/values of one key range [kb, ke) of one sequence exactly once and serves up to GM query
// heads of that kv head with them. Inside the CTA the W warps take interleaved chunks of keys;
// inside a warp, L = D/8 lanes hold one key (16 bytes = 8 dims each), so one 16-byte load per
// lane brings KPL = 32/L keys, and U such loads are in flight per lane. Each KPL-lane group
// keeps its own online-softmax state (m, l, acc[8 dims] per head), merged across groups by
// shuffles and across warps through shared memory at the end.
//
// The key range of a CTA is its share of the sequence's [first, last] (read from device
// memory), cut at whole KV blocks, so the launch shape never depends on context lengths and
// can be captured in a CUDA graph. Three ways to finish:
//   splits == 1: the CTA writes the output itself (4 warps).
//   cluster (num_seqs <= 4): the splits CTAs of one (sequence, kv head, chunk) form a thread-
//     block cluster (8 warps each); each pushes its partial (m, l per head, acc for the share of
//     (head, dim) elements a rank owns) into the owner's shared memory, one cluster barrier, and
//     each rank merges and writes its share. One kernel, no global partials.
//   otherwise: each CTA (4 warps) writes (m, l, acc) partials and decode_combine_kernel merges.
//
// F8 (FP8 caches, core/kv_fp8.h; head dims 64 and 128 take attention_decode_f8.cu's tensor-core
// kernel instead): the same lanes and keys, each lane loading its 8 dims as 8
// E4M3 codes (8 bytes instead of 16) plus the key's bf16 scale; the score is (q · codes) times the
// key's scale and the value enters as (p times the value's scale) · codes, so a scale costs one
// multiply per key, not one per element. Not fused (the fused kernel writes bf16).
//
// Fused (the cluster path of a pure-decode batch, launch_decode_fused): the same kernel starts
// from the packed q | k | v product instead of a rotated q and a cache that already holds the
// new token. Before pdl_wait it reads only what predates the step: context_lens[s],
// positions[s] and slot_mapping[s] at once (pure decode: the token of sequence s is token s, no
// query_start load), the cos/sin of the position (rope_angles), the key range, the block-table
// entries and the K/V of the first iteration's keys, all but the new token's, which is the only
// slot of this layer's cache written during the step. After the wait: the CTA rotates its q
// heads and its kv head's k (same arithmetic as rope_packed_kernel, so the same bf16 bits) into
// shared memory with v; the CTA of split 0, head chunk 0 writes k and v to the cache slot
// (exactly one writer per (token, kv head); none for slot < 0); and every CTA whose key range
// holds the new position takes that key's k / v from its own shared memory, never from the
// cache, so no CTA depends on another's cache write.
#include <algorithm>
#include <cfloat>

#include <cooperative_groups.h>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_angles.cuh"

namespace peregrine::cuda::attn {
namespace {

constexpr int kWarps = 4;  // per CTA, split-combine and splits == 1 paths
constexpr int kMaxSplits = 32;
// Cluster path: at most 6 CTAs a cluster (8, the portable size, was 7% slower on an H100: Llama
// 1B, batch 1, one head a CTA).
constexpr int kMaxClusterSplits = 6;

// Warps per CTA of the cluster path: 8 (fewer serial key iterations at batch 1) unless the
// per-warp merge buffer (W x GM x D f32) would pass 32 KB of static shared memory.
template <int D, int GM>
constexpr int cluster_warps() {
    return GM * D <= 1024 ? 8 : 4;
}

// Register budget: 128 per thread for GM < 8, 255 for GM == 8 (its q and acc are twice as large).
template <int GM, int W>
constexpr int min_ctas() {
    return (GM >= 8 ? 8 : 16) / W;
}

// FUSED (CLUSTER only): RoPE + cache write from RopeFuse r (see the top of the file).
// F8 (not FUSED): FP8 caches p.k8 / p.v8.
template <int D, int GM, int W, bool CLUSTER, bool FUSED, bool F8 = false>
__global__ void __launch_bounds__(W * 32, min_ctas<GM, W>())
    decode_kernel(const Params p, const RopeFuse r, const int splits, const int head_chunks, float* __restrict__ ws_ml,
                  float* __restrict__ ws_acc) {
    static_assert(!FUSED || CLUSTER, "the fused kernel merges its splits in a cluster");
    static_assert(!(FUSED && F8), "the fused kernel writes bf16 caches");
    constexpr int kThreads = W * 32;
    constexpr int L = D / 8;            // lanes per key
    constexpr int KPL = 32 / L;         // keys per warp-wide load
    constexpr int U = GM >= 8 ? 2 : 4;  // loads in flight per lane (registers bound it)
    constexpr int CH = KPL * U;         // keys per warp iteration
    constexpr int RS = CLUSTER ? kMaxClusterSplits : 1;
    __shared__ float sm_m[W][GM], sm_l[W][GM];
    __shared__ float sm_acc[W][GM][D];
    // Cluster path: what the cluster's CTAs push to this one, by source rank: (m, l) of every
    // head, and acc of the `per` (head, dim) elements this rank owns at [src * per, +per).
    // splits * per <= GM * D + splits - 1.
    __shared__ float rx_m[RS][GM], rx_l[RS][GM];
    __shared__ float rx_acc[CLUSTER ? GM * D + kMaxClusterSplits : 1];
    // Fused: the rotated q of the CTA's heads, the new token's rotated k and its v (bf16, as the
    // unfused path stores them), cos | sin of the token's angles.
    __shared__ __align__(16) __nv_bfloat16 sm_q[FUSED ? GM : 1][FUSED ? D : 8];
    __shared__ __align__(16) __nv_bfloat16 sm_kv[FUSED ? 2 : 1][FUSED ? D : 8];
    __shared__ float sm_cs[FUSED ? D : 1];
    pdl_launch_dependents();
    // Unfused: q, the cache and the batch arrays come from earlier work. (Fused: see below.)
    if constexpr (!FUSED) pdl_wait();

    const int split = blockIdx.x;  // == rank in the cluster (cluster dims (splits, 1, 1))
    const int kvh = blockIdx.y / head_chunks;
    const int chunk = blockIdx.y - kvh * head_chunks;
    const int s = blockIdx.z;
    int t, ctx, pos, slot = -1;
    if constexpr (FUSED) {
        // Pure decode: sequence s's token is token s. The batch arrays were written before the
        // step, so these three independent loads need no wait.
        t = s;
        ctx = p.context_lens[s];
        pos = p.positions[s];
        slot = r.slot_mapping[s];
    } else {
        t = p.query_start[s];
        ctx = p.context_lens[s];
        if (p.query_start[s + 1] - t != 1) return;  // a prefill sequence of a mixed batch (or none): whole cluster
    }
    // Cluster path: "this CTA has started"; waited on before the first store to another CTA.
    if constexpr (CLUSTER) __cluster_barrier_arrive_relaxed();
    const int h0 = kvh * p.group + chunk * GM;  // first query head of this CTA
    const int ng = min(GM, p.group - chunk * GM);
    if constexpr (!FUSED) pos = p.positions[t];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gi = lane / L;  // key slot of this lane within a warp-wide load
    const int li = lane % L;  // which 8 dims of the key this lane holds
    const int64_t row_stride = static_cast<int64_t>(p.num_heads) * D;

    // q of the CTA's heads, this lane's 8 dims, pre-scaled into log2 units (loaded before the
    // key range is known: it needs only t). Fused: after the wait, from sm_q.
    float q[GM][8];
    if constexpr (!FUSED) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            if (g < ng) {
                const uint4 w = __ldg(reinterpret_cast<const uint4*>(p.q + t * row_stride + (h0 + g) * D + li * 8));
                unpack8(w, q[g]);
#pragma unroll
                for (int i = 0; i < 8; ++i) q[g][i] *= p.scale_log2;
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) q[g][i] = 0.0f;
            }
        }
    }
    if constexpr (FUSED) rope_angles(sm_cs, static_cast<float>(pos), r.inv_freq, r.rotary_dim >> 1, r.attention_factor);
    int first, last;
    key_range(p, pos, ctx, first, last);

    const DecodeSlice slice{s, t, h0, ng, split, splits};
    int kb, ke;
    split_keys(p, first, last, split, splits, kb, ke);
    // Nothing to read: an empty partial, or zeros when this CTA is the output. (A cluster CTA
    // goes on with an empty key loop: its partial is m = -inf, l = 0, acc = 0.)
    if (!CLUSTER && kb >= ke) {
        write_empty_decode(p, slice, ws_ml);
        return;
    }

    float m[GM], l[GM], acc[GM][8];
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
    }

    const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.block_stride;
    const __nv_bfloat16* kbase = p.k_cache + kvh * D + li * 8;
    const __nv_bfloat16* vbase = p.v_cache + kvh * D + li * 8;
    const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * D;  // elements per cache slot
    const int bmask = p.block_size - 1;
    // F8: the lane's 8 codes of the key at index `in` of block `blk` lie at k8b + blk *
    // block_bytes + in * slot_stride (bytes; k8b holds kvh * D + li * 8), the key's scale at
    // p.k8 + blk * block_bytes + code_bytes + (in * num_kv_heads + kvh) * 2 (core/kv_fp8.h).
    const uint8_t* k8b = F8 ? p.k8 + kvh * D + li * 8 : nullptr;
    const uint8_t* v8b = F8 ? p.v8 + kvh * D + li * 8 : nullptr;

    // Block ids of the next iteration's keys, loaded one iteration ahead (hides the table read).
    int c0 = kb + warp * CH;
    int blk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int key = c0 + u * KPL + gi;
        blk[u] = key < ke ? __ldg(table + (key >> p.block_shift)) : 0;
    }
    // Fused: the new token's key (written by this step) comes from sm_kv, never from the cache.
    const int fresh_key = FUSED && slot >= 0 ? pos : -1;
    uint4 kr[U], vr[U];
    bool valid[U];
    // K/V of the keys [c, c + CH) of this warp (zeros past ke and for the fresh key). F8: kr / vr
    // hold {8 codes in .x, .y; the key's scale as f32 bits in .z} (all zeros past ke).
    auto load_kv = [&](int c) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int key = c + u * KPL + gi;
            valid[u] = key < ke;
            const bool ld = valid[u] && (!FUSED || key != fresh_key);
            if constexpr (F8) {
                const int64_t base = static_cast<int64_t>(blk[u]) * p.g8.block_bytes;
                const int64_t in = key & bmask;
                const int64_t code = base + in * slot_stride;
                const int64_t scale = base + p.g8.code_bytes + (in * p.num_kv_heads + kvh) * 2;
                if (ld) {
                    const uint2 kc = __ldg(reinterpret_cast<const uint2*>(k8b + code));
                    const uint2 vc = __ldg(reinterpret_cast<const uint2*>(v8b + code));
                    const uint32_t ks = __ldg(reinterpret_cast<const unsigned short*>(p.k8 + scale));
                    const uint32_t vs = __ldg(reinterpret_cast<const unsigned short*>(p.v8 + scale));
                    kr[u] = make_uint4(kc.x, kc.y, ks << 16, 0);
                    vr[u] = make_uint4(vc.x, vc.y, vs << 16, 0);
                } else {
                    kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
                }
            } else {
                const int64_t off = ((static_cast<int64_t>(blk[u]) << p.block_shift) + (key & bmask)) * slot_stride;
                kr[u] = ld ? __ldg(reinterpret_cast<const uint4*>(kbase + off)) : make_uint4(0, 0, 0, 0);
                vr[u] = ld ? __ldg(reinterpret_cast<const uint4*>(vbase + off)) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    if constexpr (FUSED) {
        // The first iteration's keys are older than the step: loaded before the wait.
        load_kv(c0);
        __syncthreads();  // sm_cs
        pdl_wait();       // qkv comes from the product before
        // Rotate the CTA's q heads (units 0..ng-1) and the kv head's k (unit ng); copy v (unit
        // ng + 1); 8 dims per item. The writer puts k and v into the cache slot.
        const int half = r.rotary_dim >> 1;
        const bool writer = slot >= 0 && split == 0 && chunk == 0;
        const __nv_bfloat16* row = r.qkv + static_cast<int64_t>(s) * (p.num_heads + 2 * p.num_kv_heads) * D;
        const int64_t dst = static_cast<int64_t>(slot) * slot_stride + kvh * D;
        constexpr int C = D / 8;
        for (int i = threadIdx.x; i < (ng + 2) * C; i += kThreads) {
            const int u = i / C, d0 = (i - u * C) * 8;
            const int col = u < ng ? (h0 + u) * D : (p.num_heads + (u - ng) * p.num_kv_heads + kvh) * D;
            const __nv_bfloat16* src = row + col;
            uint4 w = *reinterpret_cast<const uint4*>(src + d0);
            if (u <= ng && d0 < r.rotary_dim) {
                float x[8], y[8];
                unpack8(w, x);
                if (!r.neox) {  // pairs (2i, 2i + 1): inside these 8 dims
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int d = d0 + j, ip = d >> 1;
                        y[j] = d < r.rotary_dim ? rope_rotate(x[j], x[j ^ 1], sm_cs[ip], sm_cs[half + ip], (j & 1) == 0)
                                                : x[j];
                    }
                } else if (half % 8 == 0) {  // pairs (i, i + half): the partner's 8 dims in one load
                    const bool lo = d0 < half;
                    float xp[8];
                    unpack8(*reinterpret_cast<const uint4*>(src + (lo ? d0 + half : d0 - half)), xp);
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int ip = (lo ? d0 : d0 - half) + j;
                        y[j] = rope_rotate(x[j], xp[j], sm_cs[ip], sm_cs[half + ip], lo);
                    }
                } else {  // pairs (i, i + half) across 8-dim groups: the partners one by one
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int d = d0 + j;
                        const bool lo = d < half;
                        const int ip = lo ? d : d - half;
                        if (d < r.rotary_dim) {
                            const float partner = __bfloat162float(src[lo ? d + half : d - half]);
                            y[j] = rope_rotate(x[j], partner, sm_cs[ip], sm_cs[half + ip], lo);
                        } else {
                            y[j] = x[j];
                        }
                    }
                }
                w = make_uint4(pack_bf16x2(y[0], y[1]), pack_bf16x2(y[2], y[3]), pack_bf16x2(y[4], y[5]),
                               pack_bf16x2(y[6], y[7]));
            }
            if (u < ng) {
                *reinterpret_cast<uint4*>(&sm_q[u][d0]) = w;
            } else {
                *reinterpret_cast<uint4*>(&sm_kv[u - ng][d0]) = w;
                if (writer) *reinterpret_cast<uint4*>((u == ng ? r.k_cache : r.v_cache) + dst + d0) = w;
            }
        }
        __syncthreads();  // sm_q, sm_kv
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            if (g < ng) {
                unpack8(*reinterpret_cast<const uint4*>(&sm_q[g][li * 8]), q[g]);
#pragma unroll
                for (int i = 0; i < 8; ++i) q[g][i] *= p.scale_log2;
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) q[g][i] = 0.0f;
            }
        }
    }
    // One iteration over the keys [c0, c0 + CH) of this warp, whose K/V are in kr / vr.
    auto iteration = [&]() {
        if constexpr (FUSED) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (valid[u] && c0 + u * KPL + gi == fresh_key) {
                    kr[u] = *reinterpret_cast<const uint4*>(&sm_kv[0][li * 8]);
                    vr[u] = *reinterpret_cast<const uint4*>(&sm_kv[1][li * 8]);
                }
            }
        }
        const int cn = c0 + W * CH;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int key = cn + u * KPL + gi;
            blk[u] = key < ke ? __ldg(table + (key >> p.block_shift)) : 0;
        }

        // Scores (log2 units), summed over the L lanes of each key.
        float sc[U][GM];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            if constexpr (F8)
                kvf8::decode8(make_uint2(kr[u].x, kr[u].y), kf);  // codes; the scale after the sum
            else
                unpack8(kr[u], kf);
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) a = fmaf(q[g][i], kf[i], a);
#pragma unroll
                for (int off = L / 2; off >= 1; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
                if constexpr (F8) a *= __uint_as_float(kr[u].z);  // every lane of the key: the same scale
                sc[u][g] = valid[u] ? a : -INFINITY;
            }
        }
        // Online softmax update of this lane group's state.
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            float mx = sc[0][g];
#pragma unroll
            for (int u = 1; u < U; ++u) mx = fmaxf(mx, sc[u][g]);
            const float m_new = fmaxf(m[g], mx);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: keep zeros
            const float alpha = exp2f(m[g] - m_use);
            l[g] *= alpha;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float pu = exp2f(sc[u][g] - m_use);
                l[g] += pu;
                float vf[8];
                float pv = pu;
                if constexpr (F8) {
                    kvf8::decode8(make_uint2(vr[u].x, vr[u].y), vf);  // codes
                    pv = pu * __uint_as_float(vr[u].z);               // times the value's scale
                } else {
                    unpack8(vr[u], vf);
                }
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(pv, vf[i], acc[g][i]);
            }
            m[g] = m_new;
        }
    };
    // Fused: the first iteration apart (its keys were loaded before the wait; a loop that skipped
    // the first load would carry kr / vr across iterations and spill).
    if constexpr (FUSED) {
        if (c0 < ke) {
            iteration();
            c0 += W * CH;
        }
    }
    for (; c0 < ke; c0 += W * CH) {
        load_kv(c0);
        iteration();
    }

    // Merge the KPL lane groups of the warp (lanes with the same li hold the same dims).
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        float mm = m[g];
#pragma unroll
        for (int off = L; off < 32; off <<= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, off));
        const float f = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - mm);
        float ll = l[g] * f;
#pragma unroll
        for (int off = L; off < 32; off <<= 1) ll += __shfl_xor_sync(0xffffffffu, ll, off);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float a = acc[g][i] * f;
#pragma unroll
            for (int off = L; off < 32; off <<= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
            acc[g][i] = a;
        }
        m[g] = mm, l[g] = ll;
    }
    if (lane < L) {
#pragma unroll
        for (int g = 0; g < GM; ++g) {
#pragma unroll
            for (int i = 0; i < 8; ++i) sm_acc[warp][g][li * 8 + i] = acc[g][i];
            if (li == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = l[g];
        }
    }
    __syncthreads();

    if constexpr (!CLUSTER) {
        merge_decode_warps<W, GM, D>(p, slice, sm_m, sm_l, sm_acc, ws_ml, ws_acc);
    } else {
        namespace cg = cooperative_groups;
        const cg::cluster_group cluster = cg::this_cluster();
        const int n = ng * D;                       // (head, dim) elements of the CTA
        const int per = (n + splits - 1) / splits;  // rank r owns elements [r * per, (r + 1) * per)
        __cluster_barrier_wait();                   // every CTA of the cluster has started
        // Push this CTA's (m, l) of every head to every rank.
        for (int i = threadIdx.x; i < splits * ng; i += kThreads) {
            const int r = i / ng, g = i - r * ng;
            float mm = -INFINITY;
#pragma unroll
            for (int w = 0; w < W; ++w) mm = fmaxf(mm, sm_m[w][g]);
            float ll = 0.0f;
#pragma unroll
            for (int w = 0; w < W; ++w) ll += sm_m[w][g] == -INFINITY ? 0.0f : sm_l[w][g] * exp2f(sm_m[w][g] - mm);
            cluster.map_shared_rank(&rx_m[0][0], r)[split * GM + g] = mm;
            cluster.map_shared_rank(&rx_l[0][0], r)[split * GM + g] = ll;
        }
        // Push this CTA's acc of each element to the element's owner.
        for (int idx = threadIdx.x; idx < n; idx += kThreads) {
            const int g = idx / D, d = idx - g * D;
            float mm = -INFINITY;
#pragma unroll
            for (int w = 0; w < W; ++w) mm = fmaxf(mm, sm_m[w][g]);
            float a = 0.0f;
#pragma unroll
            for (int w = 0; w < W; ++w) a += sm_m[w][g] == -INFINITY ? 0.0f : sm_acc[w][g][d] * exp2f(sm_m[w][g] - mm);
            const int r = idx / per;
            cluster.map_shared_rank(rx_acc, r)[split * per + idx - r * per] = a;
        }
        __cluster_barrier_arrive();  // release: the pushes above
        __cluster_barrier_wait();    // acquire: every rank's pushes here; no remote access after this
        // Merge this rank's elements across the splits (as decode_combine_kernel does).
        for (int j = threadIdx.x; j < per; j += kThreads) {
            const int idx = split * per + j;
            if (idx >= n) break;
            const int g = idx / D, d = idx - g * D;
            float mm = -INFINITY;
#pragma unroll
            for (int i = 0; i < kMaxClusterSplits; ++i)
                if (i < splits) mm = fmaxf(mm, rx_m[i][g]);
            float ll = 0.0f, a = 0.0f;
#pragma unroll
            for (int i = 0; i < kMaxClusterSplits; ++i) {
                if (i < splits) {
                    const float wi = rx_m[i][g] == -INFINITY ? 0.0f : exp2f(rx_m[i][g] - mm);
                    if (wi != 0.0f) ll = fmaf(rx_l[i][g], wi, ll), a = fmaf(wi, rx_acc[i * per + j], a);
                }
            }
            p.out[t * row_stride + (h0 + g) * D + d] = __float2bfloat16_rn(ll > 0.0f ? a / ll : 0.0f);
        }
    }
}

// One warp per (sequence, query head): out = Σ_i acc_i 2^(m_i - M) / Σ_i l_i 2^(m_i - M).
__global__ void __launch_bounds__(128)
    decode_combine_kernel(const Params p, const int splits, const float* __restrict__ ws_ml,
                          const float* __restrict__ ws_acc) {
    pdl_launch_dependents();
    pdl_wait();
    const int gw = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int s = gw / p.num_heads, h = gw - s * p.num_heads;
    if (s >= p.num_seqs) return;
    const int t = p.query_start[s];
    if (p.query_start[s + 1] - t != 1) return;
    const int D = p.head_dim;
    const int64_t r0 = (static_cast<int64_t>(s) * p.num_heads + h) * splits;
    const float mi = lane < splits ? ws_ml[2 * (r0 + lane)] : -INFINITY;
    const float li = lane < splits ? ws_ml[2 * (r0 + lane) + 1] : 0.0f;
    float mm = mi;
    for (int off = 16; off >= 1; off >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, off));
    const float w = mi == -INFINITY ? 0.0f : exp2f(mi - mm);
    float ll = li * w;
    for (int off = 16; off >= 1; off >>= 1) ll += __shfl_xor_sync(0xffffffffu, ll, off);
    const float inv = ll > 0.0f ? 1.0f / ll : 0.0f;
    __nv_bfloat16* out = p.out + static_cast<int64_t>(t) * p.num_heads * D + static_cast<int64_t>(h) * D;
    for (int d0 = 0; d0 < D; d0 += 32) {  // uniform trip count: every lane reaches the shuffles
        const int d = d0 + lane;
        float a = 0.0f;
        for (int i = 0; i < splits; ++i) {
            const float wi = __shfl_sync(0xffffffffu, w, i);
            if (d < D && wi != 0.0f) a = fmaf(wi, ws_acc[(r0 + i) * D + d], a);
        }
        if (d < D) out[d] = __float2bfloat16_rn(a * inv);
    }
}

// fuse != nullptr: the fused kernel (head dims fused_decode_supports, cluster shape, not F8).
template <int D, int GM, bool F8>
void launch_dgf(const Params& p, const RopeFuse* fuse, const DecodeShape& sh, float* ws_ml, float* ws_acc,
                cudaStream_t stream) {
    const dim3 grid(sh.splits, p.num_kv_heads * sh.head_chunks, p.num_seqs);
    constexpr int W = cluster_warps<D, GM>();
    const RopeFuse none{};
    if (fuse != nullptr) {
        if constexpr (D >= 64 && !F8)
            launch_pdl_cluster(decode_kernel<D, GM, W, true, true>, grid, dim3(W * 32), dim3(sh.splits, 1, 1), 0,
                               stream, p, *fuse, sh.splits, sh.head_chunks, static_cast<float*>(nullptr),
                               static_cast<float*>(nullptr));
        else
            fail("rope_cache_attention: no fused kernel for head_dim ", D, F8 ? " with an FP8 cache" : "");
    } else if (sh.cluster) {
        launch_pdl_cluster(decode_kernel<D, GM, W, true, false, F8>, grid, dim3(W * 32), dim3(sh.splits, 1, 1), 0,
                           stream, p, none, sh.splits, sh.head_chunks, static_cast<float*>(nullptr),
                           static_cast<float*>(nullptr));
    } else if (p.num_seqs <= kClusterMaxSeqs) {
        // Early (programmatic) launch pays off for the few CTAs of small batches; for larger grids
        // the early CTAs land unevenly (b = 32, ctx 1024 on an H100: 38.6 us with it, 33.2 without).
        launch_pdl(decode_kernel<D, GM, kWarps, false, false, F8>, grid, dim3(kWarps * 32), 0, stream, p, none,
                   sh.splits, sh.head_chunks, ws_ml, ws_acc);
    } else {
        decode_kernel<D, GM, kWarps, false, false, F8>
            <<<grid, kWarps * 32, 0, stream>>>(p, none, sh.splits, sh.head_chunks, ws_ml, ws_acc);
    }
    check_launch(fuse != nullptr ? "rope_cache_attention" : "decode_attention");
}

// The bf16 or the FP8 (p.k8 set) kernels.
template <int D, int GM>
void launch_dg(const Params& p, const RopeFuse* fuse, const DecodeShape& sh, float* ws_ml, float* ws_acc,
               cudaStream_t stream) {
    if (p.k8 != nullptr) {
        if constexpr (D == 64 || D == 128)  // attention_decode_f8.cu (launch_decode routes there)
            fail("decode attention: FP8 caches of head_dim ", D, " take the tensor-core kernel");
        else
            launch_dgf<D, GM, true>(p, fuse, sh, ws_ml, ws_acc, stream);
    } else
        launch_dgf<D, GM, false>(p, fuse, sh, ws_ml, ws_acc, stream);
}

template <int D>
void launch_d(const Params& p, const RopeFuse* fuse, const DecodeShape& sh, float* ws_ml, float* ws_acc,
              cudaStream_t stream) {
    switch (sh.group_max) {
        case 1:
            return launch_dg<D, 1>(p, fuse, sh, ws_ml, ws_acc, stream);
        case 2:
            return launch_dg<D, 2>(p, fuse, sh, ws_ml, ws_acc, stream);
        case 4:
            return launch_dg<D, 4>(p, fuse, sh, ws_ml, ws_acc, stream);
        default:
            return launch_dg<D, 8>(p, fuse, sh, ws_ml, ws_acc, stream);
    }
}

// The decode kernel for p.head_dim (fuse: the fused kernel).
void launch_by_head_dim(const Params& p, const RopeFuse* fuse, const DecodeShape& sh, float* ws_ml, float* ws_acc,
                        cudaStream_t stream) {
    switch (p.head_dim) {
        case 8:
            return launch_d<8>(p, fuse, sh, ws_ml, ws_acc, stream);
        case 16:
            return launch_d<16>(p, fuse, sh, ws_ml, ws_acc, stream);
        case 32:
            return launch_d<32>(p, fuse, sh, ws_ml, ws_acc, stream);
        case 64:
            return launch_d<64>(p, fuse, sh, ws_ml, ws_acc, stream);
        case 128:
            return launch_d<128>(p, fuse, sh, ws_ml, ws_acc, stream);
        case 256:
            return launch_d<256>(p, fuse, sh, ws_ml, ws_acc, stream);
        default:
            fail("decode attention: unsupported head_dim ", p.head_dim);
    }
}

}  // namespace

bool decode_supports(int head_dim) {
    return head_dim == 8 || head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

DecodeShape decode_shape(int num_seqs, int num_heads, int num_kv_heads, int max_context, int sm_count,
                         bool allow_cluster) {
    DecodeShape sh;
    const int group = num_heads / num_kv_heads;
    sh.group_max = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
    sh.head_chunks = (group + sh.group_max - 1) / sh.group_max;
    // About two 4-warp CTAs per SM in total, at most 8 splits: at batch 1 and short contexts more
    // splits only lengthen the combine (measured on an H200: 32 splits made the combine 8 us per
    // layer).
    const int64_t units = std::max<int64_t>(1, static_cast<int64_t>(num_seqs) * num_kv_heads * sh.head_chunks);
    const int64_t target = 2 * static_cast<int64_t>(sm_count);
    sh.splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(std::min(kMaxSplits, 8), target / units)));
    sh.cluster = false;
    if (!allow_cluster || num_seqs > kClusterMaxSeqs || sh.splits <= 1) return sh;
    // Small batches split across a cluster of CTAs instead: the fewest query heads a CTA
    // (the most CTAs, the shortest chain of dependent steps a thread) that still leaves >= 2
    // splits, for about one CTA an SM in all when every context is short and 1.5 beyond, at most
    // kMaxClusterSplits.
    sh.cluster = true;
    const int64_t cluster_target = short_decode_class(num_seqs, max_context) ? sm_count : sm_count * 3 / 2;
    for (int gm = 1; gm <= sh.group_max; gm *= 2) {
        const int chunks = (group + gm - 1) / gm;
        const int64_t cluster_units = static_cast<int64_t>(num_seqs) * num_kv_heads * chunks;
        const int64_t splits = std::min<int64_t>(cluster_target / cluster_units, kMaxClusterSplits);
        if (splits >= 2 || gm == sh.group_max) {
            sh.group_max = gm;
            sh.head_chunks = chunks;
            sh.splits = static_cast<int>(std::max<int64_t>(splits, 2));
            break;
        }
    }
    return sh;
}

bool fused_decode_supports(int head_dim) {
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

void launch_decode_fused(const Params& p, const RopeFuse& r, const DecodeShape& sh, cudaStream_t stream) {
    if (!sh.cluster || !fused_decode_supports(p.head_dim))
        fail("rope_cache_attention: the fused kernel needs the cluster shape and head_dim 64 / 128 / 256, not ",
             p.head_dim);
    launch_by_head_dim(p, &r, sh, nullptr, nullptr, stream);
}

void launch_decode_combine(const Params& p, int splits, const float* ws_ml, const float* ws_acc, cudaStream_t stream) {
    const int64_t warps = static_cast<int64_t>(p.num_seqs) * p.num_heads;
    launch_pdl(decode_combine_kernel, dim3(static_cast<unsigned>((warps + 3) / 4)), dim3(128), 0, stream, p, splits,
               ws_ml, ws_acc);
    check_launch("decode_attention_combine");
}

void launch_decode(const Params& p, const DecodeShape& sh, float* ws_ml, float* ws_acc, cudaStream_t stream) {
    if (p.k8 != nullptr && decode_f8_mma_supports(p.head_dim)) return launch_decode_f8(p, sh, ws_ml, ws_acc, stream);
    launch_by_head_dim(p, nullptr, sh, ws_ml, ws_acc, stream);
    if (sh.splits > 1 && !sh.cluster) launch_decode_combine(p, sh.splits, ws_ml, ws_acc, stream);
}

}  // namespace peregrine::cuda::attn
