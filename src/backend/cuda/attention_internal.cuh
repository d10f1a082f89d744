// Internals of the paged-attention kernels (attention*.cu): the flat parameter block every
// kernel takes, small device helpers (bf16 unpacking, cp.async, ldmatrix, mma.sync) and the
// per-kernel launchers that attention.cu dispatches to. CUDA-only: include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace peregrine::cuda::attn {

// Everything a kernel needs, by value (kernel parameter space). Pointers are device memory.
struct Params {
    const __nv_bfloat16* q;        // [num_tokens, num_heads * head_dim]
    const __nv_bfloat16* k_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
    const __nv_bfloat16* v_cache;  // same
    __nv_bfloat16* out;            // [num_tokens, num_heads * head_dim]
    const int32_t* positions;      // [num_tokens]
    const int32_t* query_start;    // [num_seqs + 1]
    const int32_t* context_lens;   // [num_seqs]; 0: padding sequence
    const int32_t* block_tables;   // [num_seqs, block_stride]
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

// ---- Hopper/Ampere warp-level primitives (inline PTX) --------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global → shared; src_bytes == 0 zero-fills the destination (no read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
// d += a · b on tensor cores: a 16x16 bf16 (row), b 16x8 bf16 (col), d 16x8 f32.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- launchers (each checks its launch and throws peregrine::Error) --------------------------
// Decode: sequences whose query length is 1 (others are skipped, so the same launch serves the
// decode part of a mixed batch). splits > 1 writes partials to ws_ml/ws_acc and combines.
// ws_ml: [num_seqs, num_heads, splits, 2] f32 (running max in log2 units, sum of exps);
// ws_acc: [num_seqs, num_heads, splits, head_dim] f32 (unnormalised output).
struct DecodeShape {
    int group_max;    // query heads per CTA (1, 2, 4 or 8)
    int head_chunks;  // CTAs per kv head: ceil(group / group_max)
    int splits;       // CTAs per (sequence, kv head, chunk) along the keys
};
DecodeShape decode_shape(int num_seqs, int num_heads, int num_kv_heads, int sm_count);
bool decode_supports(int head_dim);
void launch_decode(const Params& p, const DecodeShape& shape, float* ws_ml, float* ws_acc, cudaStream_t stream);

// Prefill: sequences whose query length is >= 2, tiles of kPrefillTileM query tokens on tensor
// cores. `tiles`/`num_tiles` is workspace the launcher fills on the device first.
constexpr int kPrefillTileM = 64;
bool prefill_supports(int head_dim);
// Upper bound on the tiles of a batch (host-side, from the scalar fields only).
int64_t prefill_tile_bound(int num_tokens, int num_seqs, int max_query_len);
void launch_prefill(const Params& p, int tile_bound, int2* tiles, int* num_tiles, int sm_count, cudaStream_t stream);

// Any head dim (multiple of 8, <= 256), any batch: one warp per (token, query head), f32 math.
void launch_generic(const Params& p, cudaStream_t stream);

}  // namespace peregrine::cuda::attn
