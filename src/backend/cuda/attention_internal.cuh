// Internals of the paged-attention kernels (attention*.cu): the flat parameter block every
// kernel takes, small device helpers (bf16 unpacking; cp.async, ldmatrix and mma.sync come from
// warp_mma.cuh) and the per-kernel launchers that attention.cu dispatches to. CUDA-only:
// include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/warp_mma.cuh"  // cp.async, ldmatrix, mma.sync (namespace peregrine::cuda)

namespace peregrine::cuda::attn {

// Everything a kernel needs, by value (kernel parameter space). Pointers are device memory.
struct Params {
    const __nv_bfloat16* q;        // [num_tokens, num_heads * head_dim]
    const __nv_bfloat16* k_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
    const __nv_bfloat16* v_cache;  // same
    // FP8 caches (the kernels' F8 instantiations read these instead; null otherwise), geometry g8.
    const uint8_t* k8;
    const uint8_t* v8;
    kvf8::Geometry g8;
    __nv_bfloat16* out;           // [num_tokens, num_heads * head_dim]
    const int32_t* positions;     // [num_tokens]
    const int32_t* query_start;   // [num_seqs + 1]
    const int32_t* context_lens;  // [num_seqs]; 0: padding sequence
    const int32_t* block_tables;  // [num_seqs, block_stride]
    int num_tokens, num_seqs, block_stride;
    int block_size, block_shift;  // block_size == 1 << block_shift
    int num_heads, num_kv_heads, group, head_dim;
    int window;        // > 0: keys in (pos - window, pos]
    float scale;       // softmax scale (natural-exp units)
    float scale_log2;  // scale * log2(e): scores kept in log2 units so exp2 is one instruction
};

// Key range of a query at `pos` in a sequence with `ctx` cached tokens: [first, last],
// empty when last < first (ctx == 0 included). Same rule as CpuBackend::attention.
__device__ __forceinline__ void key_range(const Params& p, int pos, int ctx, int& first, int& last) {
    last = min(pos, ctx - 1);
    first = p.window > 0 ? max(0, pos - p.window + 1) : 0;
}

// Element offset of (key position `key`, kv head `kvh`, dim 0) in the cache, through the
// sequence's block table row `table`.
__device__ __forceinline__ int64_t cache_offset(const Params& p, const int32_t* table, int key, int kvh) {
    const int64_t blk = __ldg(table + (key >> p.block_shift));
    const int64_t slot = (blk << p.block_shift) + (key & (p.block_size - 1));
    return (slot * p.num_kv_heads + kvh) * p.head_dim;
}

// What one decode CTA computes: sequence s's query token t, query heads [h0, h0 + ng), key split
// `split` of `splits` (the split-combine partials' row of head h: (s * num_heads + h) * splits +
// split).
struct DecodeSlice {
    int s, t, h0, ng, split, splits;
};

// The split's keys [kb, ke) of the key range [first, last]: an equal share of whole blocks.
__device__ __forceinline__ void split_keys(const Params& p, int first, int last, int split, int splits, int& kb,
                                           int& ke) {
    kb = ke = 0;
    if (last < first) return;
    const int b0 = first >> p.block_shift, b1 = (last >> p.block_shift) + 1;
    const int per = (b1 - b0 + splits - 1) / splits;
    kb = max(first, (b0 + split * per) << p.block_shift);
    ke = min(last + 1, (b0 + (split + 1) * per) << p.block_shift);
}

// A CTA (all threads) whose split holds no key: zeros when it is the output, else an empty
// partial (m = -inf, l = 0; the combine never reads its acc).
__device__ __forceinline__ void write_empty_decode(const Params& p, const DecodeSlice& c, float* ws_ml) {
    const int D = p.head_dim;
    if (c.splits == 1) {
        const int64_t base = (static_cast<int64_t>(c.t) * p.num_heads + c.h0) * D;
        for (int i = threadIdx.x; i < c.ng * D; i += blockDim.x) p.out[base + i] = __float2bfloat16_rn(0.0f);
    } else if (static_cast<int>(threadIdx.x) < c.ng) {
        const int64_t r = (static_cast<int64_t>(c.s) * p.num_heads + c.h0 + threadIdx.x) * c.splits + c.split;
        ws_ml[2 * r] = -INFINITY;
        ws_ml[2 * r + 1] = 0.0f;
    }
}

// Merges the W warps' states (running max in log2 units, sum of exps, unnormalized acc of head
// g, dim d; after a __syncthreads) and writes the output (splits == 1) or the split's partial.
// All threads.
template <int W, int GM, int D>
__device__ __forceinline__ void merge_decode_warps(const Params& p, const DecodeSlice& c, const float (&sm_m)[W][GM],
                                                   const float (&sm_l)[W][GM], const float (&sm_acc)[W][GM][D],
                                                   float* ws_ml, float* ws_acc) {
    for (int idx = threadIdx.x; idx < c.ng * D; idx += blockDim.x) {
        const int g = idx / D, d = idx - g * D;
        float mm = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) mm = fmaxf(mm, sm_m[w][g]);
        float ll = 0.0f, a = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float f = sm_m[w][g] == -INFINITY ? 0.0f : exp2f(sm_m[w][g] - mm);
            ll += sm_l[w][g] * f;
            a += sm_acc[w][g][d] * f;
        }
        if (c.splits == 1) {
            p.out[(static_cast<int64_t>(c.t) * p.num_heads + c.h0 + g) * D + d] =
                __float2bfloat16_rn(ll > 0.0f ? a / ll : 0.0f);
        } else {
            const int64_t r = (static_cast<int64_t>(c.s) * p.num_heads + c.h0 + g) * c.splits + c.split;
            ws_acc[r * D + d] = a;
            if (d == 0) ws_ml[2 * r] = mm, ws_ml[2 * r + 1] = ll;
        }
    }
}

// The cache slot of key position `key` through the block table row `table` (FP8 readers).
__device__ __forceinline__ int64_t cache_slot(const Params& p, const int32_t* table, int key) {
    const int64_t blk = __ldg(table + (key >> p.block_shift));
    return (blk << p.block_shift) + (key & (p.block_size - 1));
}

// Two bf16 packed in a 32-bit word → two f32 (exact: bf16 is the top half of an f32).
__device__ __forceinline__ float bf16_lo(uint32_t w) {
    return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
    return __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
    f[0] = bf16_lo(v.x), f[1] = bf16_hi(v.x), f[2] = bf16_lo(v.y), f[3] = bf16_hi(v.y);
    f[4] = bf16_lo(v.z), f[5] = bf16_hi(v.z), f[6] = bf16_lo(v.w), f[7] = bf16_hi(v.w);
}
// Two f32 → packed bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- launchers (each checks its launch and throws peregrine::Error) --------------------------
// Decode: sequences whose query length is 1 (others are skipped, so the same launch serves the
// decode part of a mixed batch). splits > 1 without `cluster` writes partials to ws_ml/ws_acc
// and combines in a second kernel:
// ws_ml: [num_seqs, num_heads, splits, 2] f32 (running max in log2 units, sum of exps);
// ws_acc: [num_seqs, num_heads, splits, head_dim] f32 (unnormalised output).
// With `cluster` (num_seqs <= 4, splits > 1) the splits merge through distributed shared memory
// in the one kernel: no workspace (ws_ml / ws_acc may be null).
struct DecodeShape {
    int group_max;    // query heads per CTA (1, 2, 4 or 8)
    int head_chunks;  // CTAs per kv head: ceil(group / group_max)
    int splits;       // CTAs per (sequence, kv head, chunk) along the keys
    bool cluster;     // the splits of one (sequence, kv head, chunk) are one thread-block cluster
};
// max_context: the longest context of the batch (the cluster shape differs above
// kShortDecodeContext). allow_cluster = false: the two-kernel path at every batch size (for
// timing comparisons). The cluster shape, H100, batch 1 at 128-256 / 1,152 keys: Llama 1B (fused
// kernel) one head a CTA and 4 / 6 splits, 1,012 / 980 tok/s, where 4 heads a CTA with 2 / 8
// splits gave 995 / 948; Qwen3 1.7B (unfused) 586 / 562 against 578 / 547.
DecodeShape decode_shape(int num_seqs, int num_heads, int num_kv_heads, int max_context, int sm_count,
                         bool allow_cluster = true);
bool decode_supports(int head_dim);
// FP8 caches (p.k8 set) with decode_f8_mma_supports(head_dim) take the tensor-core kernel of
// attention_decode_f8.cu, whose shape is decode_shape_f8's (never a cluster); launch_decode
// routes there.
void launch_decode(const Params& p, const DecodeShape& shape, float* ws_ml, float* ws_acc, cudaStream_t stream);
bool decode_f8_mma_supports(int head_dim);
DecodeShape decode_shape_f8(int num_seqs, int num_heads, int num_kv_heads, int max_context, int sm_count);
void launch_decode_f8(const Params& p, const DecodeShape& shape, float* ws_ml, float* ws_acc, cudaStream_t stream);
// Merges the splits' partials into p.out (decode sequences only).
void launch_decode_combine(const Params& p, int splits, const float* ws_ml, const float* ws_acc, cudaStream_t stream);

// The fused decode step (RoPE + KV-cache write + attention, attention_decode.cu): what the
// cluster kernel needs beyond Params to start from the packed q | k | v product instead of a
// rotated q whose k/v are already cached. Params::q is unused; Params::k_cache / v_cache are
// the same caches as k_cache / v_cache here (read for the older keys, written at the new slot).
struct RopeFuse {
    const __nv_bfloat16* qkv = nullptr;     // [num_seqs, (num_heads + 2 num_kv_heads) * head_dim]
    const int32_t* slot_mapping = nullptr;  // [num_seqs]; < 0: padding (no cache write)
    const float* inv_freq = nullptr;        // [rotary_dim / 2]
    __nv_bfloat16* k_cache = nullptr;       // [num_blocks, block_size, num_kv_heads, head_dim]
    __nv_bfloat16* v_cache = nullptr;       // same
    int rotary_dim = 0;                     // even, <= head_dim
    float attention_factor = 1.0f;
    bool neox = true;  // pairs (i, i + rotary_dim / 2), else (2i, 2i + 1)
};
// Batches whose every sequence has one query token at token index s (query_start[s] == s) with
// the cluster shape (shape.cluster); head dims fused_decode_supports.
bool fused_decode_supports(int head_dim);
void launch_decode_fused(const Params& p, const RopeFuse& r, const DecodeShape& shape, cudaStream_t stream);

// Prefill: sequences whose query length is >= 2, tiles of kPrefillTileM query tokens on tensor
// cores. `tiles`/`num_tiles` is workspace the launcher fills on the device first.
constexpr int kPrefillTileM = 64;
bool prefill_supports(int head_dim);
// Upper bound on the tiles of a batch (host-side, from the scalar fields only).
int64_t prefill_tile_bound(int num_tokens, int num_seqs, int max_query_len);
void launch_prefill(const Params& p, int tile_bound, int2* tiles, int* num_tiles, int sm_count, cudaStream_t stream);

// Any head dim (multiple of 8, <= 256), any batch: one warp per (token, query head), f32 math.
// Batch-invariant as it is: a token's warp walks its own keys in a fixed order.
void launch_generic(const Params& p, cudaStream_t stream);

// Batch-invariant tensor-core attention (attention_invariant.cu), head_dim 64 / 128, for every
// sequence of the batch. Tiles of up to kInvariantTileRows (token, head) rows sharing a kv head;
// keys in partitions of kInvariantPartition absolute positions, folded in order.
constexpr int kInvariantTileRows = 64;
constexpr int kInvariantPartition = 256;
bool invariant_supports(int head_dim, int group);
int invariant_tokens_per_tile(int group);  // query tokens per tile: 64 / group
// Upper bound on the item list (host-side, from the scalar fields only), tt tokens per tile.
int64_t invariant_item_bound(int num_tokens, int num_seqs, int max_query_len, int tt, int pcap);
struct InvariantWorkspace {
    int2* split = nullptr;     // [num_seqs] {first partial slot, partitions}; {0, 0}: not split
    int* num_items = nullptr;  // [1]
    int4* items = nullptr;     // [item_capacity] {seq, first query token of the tile, partition or -1, slot}
    int item_capacity = 0;
    int pcap = 0;          // partial slots: (decode token, partition) pairs
    float* ml = nullptr;   // [pcap, num_heads, 2] f32: max (log2 units), sum of exps
    float* acc = nullptr;  // [pcap, num_heads, head_dim] f32: unnormalised output
};
void launch_invariant(const Params& p, const InvariantWorkspace& w, int sm_count, cudaStream_t stream);

}  // namespace peregrine::cuda::attn
