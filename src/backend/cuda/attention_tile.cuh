// The FlashAttention-2 inner step both tensor-core attention kernels share (attention_prefill.cu
// and attention_invariant.cu): one tile of BN keys against a warp's 16 query rows, on mma.sync.
// CUDA-only: include from .cu files after attention_internal.cuh.
#pragma once

#include <climits>

#include "backend/cuda/attention_internal.cuh"

namespace peregrine::cuda::attn {

// Shared-memory element offset of 16-byte chunk `c` of row `r` in a [rows, D] bf16 tile (rows
// XOR-swizzled in 16-byte chunks so ldmatrix is conflict-free).
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
    return r * D + ((c ^ (r & 7)) << 3);
}

// Key ranges of a CTA's query rows (4 warps x 16 rows; this lane's rows i = 0, 1 with
// [first[i], last[i]], valid[i] false for rows without output): the union [kmin, kmax] of the
// non-empty ranges over the CTA and over this warp, and the intersection [max_first, min_last]
// of every valid row's range over the CTA (a tile inside it needs no mask). `red`: [warps][4]
// shared scratch; the call synchronises the CTA.
struct KeySpan {
    int kmin, kmax;            // CTA union (kmin == INT_MAX: no key at all)
    int warp_kmin, warp_kmax;  // this warp's union
    int max_first, min_last;   // CTA intersection
};
template <int kWarps>
__device__ __forceinline__ KeySpan reduce_key_span(const int (&first)[2], const int (&last)[2], const bool (&valid)[2],
                                                   int (*red)[4]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kmin = INT_MAX, kmax = -1, max_first = INT_MIN, min_last = INT_MAX;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (valid[i]) {
            max_first = max(max_first, first[i]);
            min_last = min(min_last, last[i]);
            if (last[i] >= first[i]) kmin = min(kmin, first[i]), kmax = max(kmax, last[i]);
        }
    }
    KeySpan k;
    k.warp_kmin = kmin = __reduce_min_sync(0xffffffffu, kmin);
    k.warp_kmax = kmax = __reduce_max_sync(0xffffffffu, kmax);
    max_first = __reduce_max_sync(0xffffffffu, max_first);
    min_last = __reduce_min_sync(0xffffffffu, min_last);
    if (lane == 0) red[warp][0] = kmin, red[warp][1] = kmax, red[warp][2] = max_first, red[warp][3] = min_last;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        kmin = min(kmin, red[w][0]), kmax = max(kmax, red[w][1]);
        max_first = max(max_first, red[w][2]), min_last = min(min_last, red[w][3]);
    }
    k.kmin = kmin, k.kmax = kmax, k.max_first = max_first, k.min_last = min_last;
    return k;
}

// Issues the cp.async copies of the K and V tile at key position kt (BN keys of kv head kvh,
// through the sequence's block table) into k_sm / v_sm ([BN][D], swizzled); keys outside
// [kmin, kmax] are zero-filled, never read. Every thread of the CTA (kThreads) calls it.
template <int D, int BN, int kThreads>
__device__ __forceinline__ void load_kv_tile(const Params& p, const int32_t* table, int kvh, int kmin, int kmax, int kt,
                                             uint32_t k_sm, uint32_t v_sm) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int i = 0; i < BN * CPR / kThreads; ++i) {
        const int idx = threadIdx.x + i * kThreads;
        const int r = idx / CPR, c = idx % CPR;
        const int key = kt + r;
        const bool ok = key >= kmin && key <= kmax;
        const int64_t off = ok ? cache_offset(p, table, key, kvh) + c * 8 : 0;
        const uint32_t dst = static_cast<uint32_t>(swz<D>(r, c) * 2);
        cp_async16(k_sm + dst, p.k_cache + off, ok ? 16 : 0);
        cp_async16(v_sm + dst, p.v_cache + off, ok ? 16 : 0);
    }
}

// The same tile from FP8 caches (p.k8 / p.v8), each 16-byte chunk of a row from its 8 codes
// times the key's scale, rounded to bf16 (within 2^-9 of the value read back), with plain loads
// and shared stores instead of cp.async: the caller's __syncthreads before a buffer is read
// orders these stores as its cp_async_wait orders the copies. k_sm / v_sm: the tile's buffers.
template <int D, int BN, int kThreads>
__device__ __forceinline__ void load_kv_tile_f8(const Params& p, const int32_t* table, int kvh, int kmin, int kmax,
                                                int kt, __nv_bfloat16* k_sm, __nv_bfloat16* v_sm) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row (8 codes each)
#pragma unroll
    for (int i = 0; i < BN * CPR / kThreads; ++i) {
        const int idx = threadIdx.x + i * kThreads;
        const int r = idx / CPR, c = idx % CPR;
        const int key = kt + r;
        uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
        if (key >= kmin && key <= kmax) {
            const int64_t slot = cache_slot(p, table, key);
            const int64_t co = kvf8::code_offset(p.g8, slot, kvh) + c * 8, so = kvf8::scale_offset(p.g8, slot, kvh);
            float f[8];
            kvf8::dequant8(__ldg(reinterpret_cast<const uint2*>(p.k8 + co)), kvf8::load_scale(p.k8, so), f);
            kw = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                            pack_bf16x2(f[6], f[7]));
            kvf8::dequant8(__ldg(reinterpret_cast<const uint2*>(p.v8 + co)), kvf8::load_scale(p.v8, so), f);
            vw = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                            pack_bf16x2(f[6], f[7]));
        }
        *reinterpret_cast<uint4*>(k_sm + swz<D>(r, c)) = kw;
        *reinterpret_cast<uint4*>(v_sm + swz<D>(r, c)) = vw;
    }
}

// The same FP8 tile in two phases, so that its global reads overlap the previous tile's
// products: issue_kv_tile_f8 copies the codes with cp.async into a staging area ([BN][D] bytes for
// K, the same for V) and loads the keys' scales into the thread's registers; once the copies
// have landed (cp_async_wait), convert_kv_tile_f8 turns the same thread's chunks into the bf16
// tiles (same values as load_kv_tile_f8). Each thread converts exactly the chunks it copied: no
// barrier between the two. Needs every (slot, kv head)'s codes 16-byte aligned (block_bytes and
// the cache pointers multiples of 16); keys outside [kmin, kmax] are zero-filled, never read.
template <int D, int BN, int kThreads>
struct F8Stage {
    static constexpr int CPR = D / 16;             // 16-code chunks per row
    static constexpr int N = BN * CPR / kThreads;  // chunks per thread and tensor
    uint32_t ks[N], vs[N];                         // bf16 scale bits of the chunks' keys (0: zero-filled)
};
template <int D, int BN, int kThreads>
__device__ __forceinline__ void issue_kv_tile_f8(const Params& p, const int32_t* table, int kvh, int kmin, int kmax,
                                                 int kt, uint8_t* k_st, uint8_t* v_st, F8Stage<D, BN, kThreads>& st) {
    using S = F8Stage<D, BN, kThreads>;
#pragma unroll
    for (int i = 0; i < S::N; ++i) {
        const int idx = threadIdx.x + i * kThreads;
        const int r = idx / S::CPR, c = idx % S::CPR;
        const int key = kt + r;
        const uint32_t dst = static_cast<uint32_t>(r * D + c * 16);
        if (key >= kmin && key <= kmax) {
            const int64_t slot = cache_slot(p, table, key);
            const int64_t co = kvf8::code_offset(p.g8, slot, kvh) + c * 16, so = kvf8::scale_offset(p.g8, slot, kvh);
            cp_async16(smem_addr(k_st) + dst, p.k8 + co, 16);
            cp_async16(smem_addr(v_st) + dst, p.v8 + co, 16);
            st.ks[i] = __ldg(reinterpret_cast<const unsigned short*>(p.k8 + so));
            st.vs[i] = __ldg(reinterpret_cast<const unsigned short*>(p.v8 + so));
        } else {
            cp_async16(smem_addr(k_st) + dst, p.k8, 0);
            cp_async16(smem_addr(v_st) + dst, p.v8, 0);
            st.ks[i] = st.vs[i] = 0;
        }
    }
}
template <int D, int BN, int kThreads>
__device__ __forceinline__ void convert_kv_tile_f8(const uint8_t* k_st, const uint8_t* v_st,
                                                   const F8Stage<D, BN, kThreads>& st, __nv_bfloat16* k_sm,
                                                   __nv_bfloat16* v_sm) {
    using S = F8Stage<D, BN, kThreads>;
    // 8 codes (2 words) times `scale` -> one 16-byte bf16 chunk of row r.
    auto put = [](__nv_bfloat16* tile, int r, int chunk, uint32_t lo, uint32_t hi, float scale) {
        float f[8];
        kvf8::dequant8(make_uint2(lo, hi), scale, f);
        *reinterpret_cast<uint4*>(tile + swz<D>(r, chunk)) = make_uint4(
            pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
    };
#pragma unroll
    for (int i = 0; i < S::N; ++i) {
        const int idx = threadIdx.x + i * kThreads;
        const int r = idx / S::CPR, c = idx % S::CPR;
        const uint4 kw = *reinterpret_cast<const uint4*>(k_st + r * D + c * 16);
        const uint4 vw = *reinterpret_cast<const uint4*>(v_st + r * D + c * 16);
        const float ksc = kvf8::scale_value(static_cast<uint16_t>(st.ks[i]));
        const float vsc = kvf8::scale_value(static_cast<uint16_t>(st.vs[i]));
        put(k_sm, r, 2 * c, kw.x, kw.y, ksc);
        put(k_sm, r, 2 * c + 1, kw.z, kw.w, ksc);
        put(v_sm, r, 2 * c, vw.x, vw.y, vsc);
        put(v_sm, r, 2 * c + 1, vw.z, vw.w, vsc);
    }
}

// One tile step for this warp's rows (mma C layout: this lane holds rows lane/4 and lane/4 + 8,
// i = 0 and 1): S = Q·Kᵀ in log2 units, keys outside [first[i], last[i]] masked when need_mask,
// the online softmax update of m (running max, log2 units), l (sum of exps) and o (unnormalised
// output), then O += P·V. qf: the rows' A fragments; kb, vb: the tile's K and V in shared memory
// ([BN][D], swizzled); kt: key position of the tile's first row.
template <int D, int BN>
__device__ __forceinline__ void flash_tile_step(const uint32_t (&qf)[D / 16][4], const __nv_bfloat16* kb,
                                                const __nv_bfloat16* vb, int kt, bool need_mask, const int (&first)[2],
                                                const int (&last)[2], float scale_log2, float (&m)[2], float (&l)[2],
                                                float (&o)[D / 8][4]) {
    constexpr int KT = D / 16;  // k-steps of Q·Kᵀ
    constexpr int NT = BN / 8;  // n-tiles of S (8 keys each)
    constexpr int DT = D / 8;   // n-tiles of O (8 dims each)
    const int lane = threadIdx.x & 31;

    // S = Q·Kᵀ: 16 rows x BN keys per warp.
    float sc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
        for (int nb = 0; nb < NT / 2; ++nb) {
            const int r = nb * 16 + (lane & 7) + ((lane >> 4) << 3);
            const int c = 2 * kk + ((lane >> 3) & 1);
            uint32_t b0, b1, b2, b3;
            ldmatrix_x4(smem_addr(kb + swz<D>(r, c)), b0, b1, b2, b3);
            mma_bf16_16816(sc[2 * nb], qf[kk], b0, b1);
            mma_bf16_16816(sc[2 * nb + 1], qf[kk], b2, b3);
        }
    }
    // Scale to log2 units; mask when the tile is not inside every row's range.
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = sc[n][e] * scale_log2;
            if (need_mask) {
                const int key = kt + n * 8 + 2 * (lane & 3) + (e & 1);
                const int i = e >> 1;
                if (key < first[i] || key > last[i]) v = -INFINITY;
            }
            sc[n][e] = v;
        }
    }
    // Online softmax (each row lives in 4 lanes: lane&3 = column pair).
    float alpha[2], m_use[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(sc[n][2 * i], sc[n][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[i], mx);
        m_use[i] = m_new == -INFINITY ? 0.0f : m_new;  // row masked so far: stays zero
        alpha[i] = exp2f(m[i] - m_use[i]);
        m[i] = m_new;
    }
    float rs[2] = {0.0f, 0.0f};
    uint32_t pa[BN / 16][4];  // P as A fragments (bf16), k = keys
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const float p0 = exp2f(sc[n][0] - m_use[0]), p1 = exp2f(sc[n][1] - m_use[0]);
        const float p2 = exp2f(sc[n][2] - m_use[1]), p3 = exp2f(sc[n][3] - m_use[1]);
        rs[0] += p0 + p1;
        rs[1] += p2 + p3;
        pa[n >> 1][(n & 1) * 2 + 0] = pack_bf16x2(p0, p1);
        pa[n >> 1][(n & 1) * 2 + 1] = pack_bf16x2(p2, p3);
    }
    l[0] = l[0] * alpha[0] + rs[0];
    l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
    for (int d = 0; d < DT; ++d) {
        o[d][0] *= alpha[0], o[d][1] *= alpha[0];
        o[d][2] *= alpha[1], o[d][3] *= alpha[1];
    }
    // O += P·V.
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
#pragma unroll
        for (int db = 0; db < DT / 2; ++db) {
            const int r = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
            const int c = 2 * db + (lane >> 4);
            uint32_t b0, b1, b2, b3;
            ldmatrix_x4_trans(smem_addr(vb + swz<D>(r, c)), b0, b1, b2, b3);
            mma_bf16_16816(o[2 * db], pa[ks], b0, b1);
            mma_bf16_16816(o[2 * db + 1], pa[ks], b2, b3);
        }
    }
}

}  // namespace peregrine::cuda::attn
