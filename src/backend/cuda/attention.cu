// paged_attention: picks the kernels for a batch and lays out their workspace.
//
//   max_query_len == 1, head_dim in {8..256, powers of two} → decode (split-KV; <= 4 sequences:
//                        one cluster kernel, more: + combine kernel)
//   max_query_len > 1,  head_dim 64 / 128 → prefill tile list + tensor-core prefill for the
//                        sequences with >= 2 query tokens, and decode for those with 1
//   anything else (head_dim 80, 96, ...)   → generic kernel for every token
//   args.batch_invariant: head_dim 64 / 128 → the invariant kernels (attention_invariant.cu) for
//                        every sequence; other head dims → the generic kernel (invariant as is)
//
// FP8 caches (AttentionArgs::k_fp8): the same choice, each kernel's F8 instantiation, which loads
// the E4M3 codes (half the bytes of bf16) and the per-(token, head) scales, except decode at
// head_dim 64 / 128: the tensor-core kernel of attention_decode_f8.cu (split + combine, never a
// cluster); the fused decode below takes bf16 caches only (FP8 batches run
// rope_and_cache_packed_fp8 + paged_attention).
//
// rope_cache_attention: the decode step's RoPE + cache write + attention as one cluster kernel
// (launch_decode_fused, attention_decode.cu) for pure-decode batches of <= 4 sequences; no
// workspace.
//
// Workspace layout (offsets 256-byte aligned, sized by this batch's shape):
//   [decode partials m,l: rows x 2 f32][decode partials acc: rows x head_dim f32]
//   [tile count: int, padded to 256 B][tile list: tile_bound x int2]
// with rows = num_seqs * splits * num_heads when splits > 1 and the decode does not merge in a
// cluster, else 0. Invariant mode:
//   [split: num_seqs x int2][item count: int, padded to 256 B][items: item_bound x int4]
//   [partials m,l: pcap x num_heads x 2 f32][partials acc: pcap x num_heads x head_dim f32]
// with pcap = 8 * SMs (decode-token partitions computed apart, see attention_invariant.cu).
#include <algorithm>
#include <atomic>

#include "backend/cuda/attention_hooks.cuh"
#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda {
namespace {

std::atomic<AttentionKernelChoice> g_choice{AttentionKernelChoice::Auto};

constexpr size_t align256(size_t x) {
    return (x + 255) & ~size_t{255};
}

struct Layout {
    size_t ml = 0, acc = 0, count = 0, tiles = 0, total = 0;
};

Layout layout(int64_t partial_rows, int head_dim, int64_t tile_bound) {
    Layout w;
    w.ml = 0;
    w.acc = align256(static_cast<size_t>(partial_rows) * 2 * sizeof(float));
    w.count = align256(w.acc + static_cast<size_t>(partial_rows) * head_dim * sizeof(float));
    w.tiles = w.count + 256;
    w.total = w.tiles + static_cast<size_t>(tile_bound) * sizeof(int2);
    return w;
}

struct InvariantLayout {
    size_t split = 0, count = 0, items = 0, ml = 0, acc = 0, total = 0;
};

InvariantLayout invariant_layout(int num_seqs, int64_t item_bound, int pcap, int num_heads, int head_dim) {
    InvariantLayout w;
    w.count = align256(static_cast<size_t>(num_seqs) * sizeof(int2));
    w.items = w.count + 256;
    w.ml = align256(w.items + static_cast<size_t>(item_bound) * sizeof(int4));
    w.acc = align256(w.ml + static_cast<size_t>(pcap) * num_heads * 2 * sizeof(float));
    w.total = w.acc + static_cast<size_t>(pcap) * num_heads * head_dim * sizeof(float);
    return w;
}

int invariant_pcap(int sms) {
    return 8 * sms;
}

bool is_pow2(int x) {
    return x > 0 && (x & (x - 1)) == 0;
}

bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

attn::Params make_params(const AttentionArgs& a) {
    const DeviceBatch& b = a.batch;
    attn::Params p{};
    p.q = reinterpret_cast<const __nv_bfloat16*>(a.q);
    p.k_cache = reinterpret_cast<const __nv_bfloat16*>(a.k_cache);
    p.v_cache = reinterpret_cast<const __nv_bfloat16*>(a.v_cache);
    if (a.k_fp8 != nullptr || a.v_fp8 != nullptr) {
        if (a.k_fp8 == nullptr || a.v_fp8 == nullptr) fail("paged_attention: k_fp8 and v_fp8 go together");
        p.k8 = a.k_fp8;
        p.v8 = a.v_fp8;
        p.g8 = kvf8::checked_geometry(b.block_size, a.num_kv_heads, a.head_dim, "paged_attention");
    }
    p.out = reinterpret_cast<__nv_bfloat16*>(a.out);
    p.positions = b.positions;
    p.query_start = b.query_start;
    p.context_lens = b.context_lens;
    p.block_tables = b.block_tables;
    p.num_tokens = b.num_tokens;
    p.num_seqs = b.num_seqs;
    p.block_stride = b.block_stride;
    p.block_size = b.block_size;
    p.block_shift = __builtin_ctz(static_cast<unsigned>(b.block_size));
    p.num_heads = a.num_heads;
    p.num_kv_heads = a.num_kv_heads;
    p.group = a.num_heads / a.num_kv_heads;
    p.head_dim = a.head_dim;
    p.window = a.window;
    p.scale = a.scale;
    p.scale_log2 = a.scale * 1.4426950408889634f;
    return p;
}

}  // namespace

void set_attention_kernel_choice(AttentionKernelChoice choice) {
    g_choice.store(choice);
}

size_t attention_workspace_bytes(int max_tokens, int num_heads, int head_dim, bool batch_invariant) {
    if (batch_invariant) {  // bounded over every group size (tt >= 1 token per tile)
        const int pcap = invariant_pcap(sm_count());
        const int64_t items = attn::invariant_item_bound(max_tokens, max_tokens, max_tokens, 1, pcap);
        return invariant_layout(max_tokens, items, pcap, num_heads, head_dim).total;
    }
    // Decode partials exist only when splits > 1, and then num_seqs * splits <= 2 * SMs.
    const int64_t rows = 2 * static_cast<int64_t>(sm_count()) * num_heads;
    const int64_t tiles = attn::prefill_tile_bound(max_tokens, max_tokens, max_tokens);
    return layout(rows, head_dim, tiles).total;
}

size_t attention_workspace_bytes(int max_tokens, int num_heads, int head_dim) {
    return std::max(attention_workspace_bytes(max_tokens, num_heads, head_dim, false),
                    attention_workspace_bytes(max_tokens, num_heads, head_dim, true));
}

void paged_attention(const AttentionArgs& args, cudaStream_t stream) {
    const DeviceBatch& b = args.batch;
    const int H = args.num_heads, KVH = args.num_kv_heads, D = args.head_dim;
    if (H <= 0 || KVH <= 0 || H % KVH != 0)
        fail("paged_attention: num_heads ", H, " is not a multiple of num_kv_heads ", KVH);
    if (D < 8 || D > 256 || D % 8 != 0) fail("paged_attention: unsupported head_dim ", D);
    if (!is_pow2(b.block_size)) fail("paged_attention: block_size ", b.block_size, " is not a power of two");
    if (b.num_tokens <= 0 || b.num_seqs <= 0) return;

    const attn::Params p = make_params(args);

    const AttentionKernelChoice choice = g_choice.load();
    const bool generic_only = choice == AttentionKernelChoice::Generic;
    if (args.batch_invariant) {
        if (generic_only || !attn::invariant_supports(D, p.group)) {
            attn::launch_generic(p, stream);
            return;
        }
        const int sms = sm_count(), pcap = invariant_pcap(sms);
        const int tt = attn::invariant_tokens_per_tile(p.group);
        const int64_t bound = attn::invariant_item_bound(b.num_tokens, b.num_seqs, b.max_query_len, tt, pcap);
        const InvariantLayout w = invariant_layout(b.num_seqs, bound, pcap, H, D);
        if (args.workspace == nullptr || args.workspace_bytes < w.total)
            fail("paged_attention: workspace of ", args.workspace_bytes, " bytes, this batch needs ", w.total);
        char* ws = static_cast<char*>(args.workspace);
        attn::InvariantWorkspace iw;
        iw.split = reinterpret_cast<int2*>(ws + w.split);
        iw.num_items = reinterpret_cast<int*>(ws + w.count);
        iw.items = reinterpret_cast<int4*>(ws + w.items);
        iw.item_capacity = static_cast<int>(bound);
        iw.pcap = pcap;
        iw.ml = reinterpret_cast<float*>(ws + w.ml);
        iw.acc = reinterpret_cast<float*>(ws + w.acc);
        attn::launch_invariant(p, iw, sms, stream);
        return;
    }
    const bool decode_only = b.max_query_len <= 1;
    const bool use_decode = !generic_only && attn::decode_supports(D) && (decode_only || attn::prefill_supports(D));
    const bool use_prefill = !generic_only && !decode_only && attn::prefill_supports(D);
    if (!use_decode && !use_prefill) {
        attn::launch_generic(p, stream);
        return;
    }

    const int sms = sm_count();
    const attn::DecodeShape shape = p.k8 != nullptr && attn::decode_f8_mma_supports(D)
                                        ? attn::decode_shape_f8(b.num_seqs, H, KVH, b.max_context_len, sms)
                                        : attn::decode_shape(b.num_seqs, H, KVH, b.max_context_len, sms,
                                                             choice != AttentionKernelChoice::SplitCombine);
    const int64_t rows = shape.splits > 1 && !shape.cluster ? static_cast<int64_t>(b.num_seqs) * shape.splits * H : 0;
    const int64_t tile_bound = use_prefill ? attn::prefill_tile_bound(b.num_tokens, b.num_seqs, b.max_query_len) : 0;
    const Layout w = layout(rows, D, tile_bound);
    const bool need_ws = rows > 0 || tile_bound > 0;
    if (need_ws && (args.workspace == nullptr || args.workspace_bytes < w.total))
        fail("paged_attention: workspace of ", args.workspace_bytes, " bytes, this batch needs ", w.total);
    char* ws = static_cast<char*>(args.workspace);

    if (use_decode) {
        float* ml = rows > 0 ? reinterpret_cast<float*>(ws + w.ml) : nullptr;
        float* acc = rows > 0 ? reinterpret_cast<float*>(ws + w.acc) : nullptr;
        attn::launch_decode(p, shape, ml, acc, stream);
    }
    if (use_prefill) {
        attn::launch_prefill(p, static_cast<int>(tile_bound), reinterpret_cast<int2*>(ws + w.tiles),
                             reinterpret_cast<int*>(ws + w.count), sms, stream);
    }
}

bool rope_cache_attention_supported(const RopeCacheAttentionArgs& a) {
    const DeviceBatch& b = a.attn.batch;
    const int H = a.attn.num_heads, KVH = a.attn.num_kv_heads, D = a.attn.head_dim;
    if (g_choice.load() != AttentionKernelChoice::Auto) return false;
    if (a.attn.k_fp8 != nullptr || a.attn.v_fp8 != nullptr) return false;  // the fused kernel writes bf16
    if (b.num_seqs < 1 || b.num_seqs > kClusterMaxSeqs || b.num_tokens != b.num_seqs || b.max_query_len != 1)
        return false;
    if (H <= 0 || KVH <= 0 || H % KVH != 0 || !attn::fused_decode_supports(D) || !is_pow2(b.block_size)) return false;
    if (a.rotary_dim < 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > D) return false;
    if (!aligned16(a.qkv) || !aligned16(a.attn.k_cache) || !aligned16(a.attn.v_cache) || !aligned16(a.attn.out))
        return false;
    return attn::decode_shape(b.num_seqs, H, KVH, b.max_context_len, sm_count()).cluster;
}

void rope_cache_attention(const RopeCacheAttentionArgs& a, cudaStream_t stream) {
    const DeviceBatch& b = a.attn.batch;
    if (!rope_cache_attention_supported(a))
        fail("rope_cache_attention: unsupported batch or shape (", b.num_seqs, " sequences, ", b.num_tokens,
             " tokens, heads ", a.attn.num_heads, "/", a.attn.num_kv_heads, ", head_dim ", a.attn.head_dim,
             ", rotary_dim ", a.rotary_dim, ")");
    attn::RopeFuse r;
    r.qkv = reinterpret_cast<const __nv_bfloat16*>(a.qkv);
    r.slot_mapping = b.slot_mapping;
    r.inv_freq = a.inv_freq;
    // The caches attention reads are also the ones this step writes (AttentionArgs holds them
    // read-only for paged_attention).
    r.k_cache = reinterpret_cast<__nv_bfloat16*>(const_cast<bf16_t*>(a.attn.k_cache));
    r.v_cache = reinterpret_cast<__nv_bfloat16*>(const_cast<bf16_t*>(a.attn.v_cache));
    r.rotary_dim = a.rotary_dim;
    r.attention_factor = a.attention_factor;
    r.neox = a.neox;
    attn::launch_decode_fused(
        make_params(a.attn), r,
        attn::decode_shape(b.num_seqs, a.attn.num_heads, a.attn.num_kv_heads, b.max_context_len, sm_count()), stream);
}

}  // namespace peregrine::cuda
