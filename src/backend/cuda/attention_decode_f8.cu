// Decode attention over FP8 caches (core/kv_fp8.h) on tensor cores, head_dim 64 and 128.
//
// Why not the SIMT decode kernel's F8 instantiation: there each lane still takes 8 dims of a
// key, so a key costs as many loads, shuffles and FMAs as in bf16 for half the bytes, plus the
// code conversions: on an H100 it moved FP8 K/V at ~1.0 TB/s where the bf16 kernel moves bf16 at
// ~2.6 (8B shape, batch 32 x 8K keys), slower than bf16 KV in all. Here a warp takes 16 keys an
// iteration and multiplies them on tensor cores (mma m16n8k16, f16 operands, f32 accumulate;
// an E4M3 code is exact in f16, so a code costs one conversion for two values).
//
// Grid (splits, num_kv_heads * head_chunks, num_seqs), W warps: as the split-combine path of
// attention_decode.cu (same key ranges, same partials and combine), with up to 8 query heads a
// CTA (the mma's n). Per warp iteration, keys [c, c + 16), lane = 4 g + q:
//   S^T = K Q^T   A = K [16 keys x 16 dims] per k-step, B = Q^T [16 dims x 8 heads]. The dims of a
//                 k-step are permuted so that lane q's four k-columns {2q, 2q+1, 2q+8, 2q+9} are
//                 dims q D/4 + 4 ks + {0..3}: a lane loads D/4 contiguous code bytes of keys g
//                 and g + 8 and converts them in pairs with no byte shuffling; Q^T (registers,
//                 f16, pre-scaled into log2 units) follows the same permutation.
//                 The accumulator holds (key g | g + 8, head 2q | 2q + 1), times the key's scale.
//   O^T += V^T P'^T  A = V^T [16 dims x 16 keys] per m-tile (rows g, g + 8 of m-tile i are dims
//                 g D/8 + 2i, + 1: a lane loads D/8 contiguous code bytes of keys 2q, 2q+1, 2q+8,
//                 2q+9 and pairs them by byte permutes), B = P'^T [16 keys x 8 heads]: the
//                 probabilities from the S^T accumulator, transposed by movmatrix.
// Scales: the score is (q . codes) x the key's K scale. A value's V scale vs enters through the
// probability: P' = 2^(s + log2 vs - n) with n the running max of s + log2 vs, so P' <= 1 in
// f16 whatever the scales' range; the sum of exps l keeps its own running max m of s, and a
// warp's acc is brought to m's units (x 2^(n - m)) before the merge. Partials and merge are the
// split-combine path's (m, l in log2 units, acc unnormalized).
#include <cfloat>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda::attn {
namespace {

constexpr int kHeads = 8;  // query heads a CTA: the mma's n
constexpr int kWarpsF8 = 8;
constexpr int kMaxSplitsF8 = 16;  // beyond short contexts (combine: one warp, <= 32)

// Two E4M3 codes (the low 16 bits, low byte first) -> f16x2 (exact).
__device__ __forceinline__ uint32_t f16x2_of(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// N 32-bit words from `src` (8-byte aligned; 16-byte aligned when A16) into w.
template <int N, bool A16>
__device__ __forceinline__ void load_words(const uint8_t* src, uint32_t (&w)[N]) {
    if constexpr (A16 && N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(src) + i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
            const uint2 v = __ldg(reinterpret_cast<const uint2*>(src) + i);
            w[2 * i] = v.x, w[2 * i + 1] = v.y;
        }
    }
}

// A16: every (slot, kv head)'s codes start 16-byte aligned (block_bytes % 16 == 0).
template <int D, int W, bool A16>
__global__ void __launch_bounds__(W * 32, 2)
    decode_f8_mma_kernel(const Params p, const int splits, const int head_chunks, float* __restrict__ ws_ml,
                         float* __restrict__ ws_acc) {
    constexpr int KS = D / 16;  // k-steps of K Q^T; also the m-tiles (16 dims) of V^T P'^T
    constexpr int KW = D / 16;  // 32-bit words of K codes a lane holds per key (D / 4 bytes)
    constexpr int VW = D / 32;  // of V codes (D / 8 bytes)
    __shared__ float sm_m[W][kHeads], sm_l[W][kHeads];
    __shared__ float sm_acc[W][kHeads][D];
    pdl_launch_dependents();
    pdl_wait();

    const int split = blockIdx.x;
    const int kvh = blockIdx.y / head_chunks;
    const int chunk = blockIdx.y - kvh * head_chunks;
    const int s = blockIdx.z;
    const int t = p.query_start[s];
    if (p.query_start[s + 1] - t != 1) return;  // a prefill sequence of a mixed batch (or none)
    const int ctx = p.context_lens[s];
    const int h0 = kvh * p.group + chunk * kHeads;
    const int ng = min(kHeads, p.group - chunk * kHeads);
    const int pos = p.positions[t];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, q4 = lane & 3;
    const int64_t row_stride = static_cast<int64_t>(p.num_heads) * D;

    int first, last;
    key_range(p, pos, ctx, first, last);
    const DecodeSlice slice{s, t, h0, ng, split, splits};
    int kb, ke;
    split_keys(p, first, last, split, splits, kb, ke);
    if (kb >= ke) {
        write_empty_decode(p, slice, ws_ml);
        return;
    }

    // Q^T fragments: head g, dims q4 * D/4 + 4 ks + {0, 1} (qf[ks][0]) and {2, 3} (qf[ks][1]).
    uint32_t qf[KS][2];
    if (g < ng) {
        const __nv_bfloat16* qrow = p.q + t * row_stride + static_cast<int64_t>(h0 + g) * D + q4 * (D / 4);
#pragma unroll
        for (int j = 0; j < D / 32; ++j) {  // 8 dims a load: k-steps 2j and 2j + 1
            float f[8];
            unpack8(__ldg(reinterpret_cast<const uint4*>(qrow) + j), f);
#pragma unroll
            for (int i = 0; i < 8; ++i) f[i] *= p.scale_log2;
            qf[2 * j][0] = half2_bits(f[0], f[1]), qf[2 * j][1] = half2_bits(f[2], f[3]);
            qf[2 * j + 1][0] = half2_bits(f[4], f[5]), qf[2 * j + 1][1] = half2_bits(f[6], f[7]);
        }
    } else {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) qf[ks][0] = qf[ks][1] = 0u;
    }

    // Per head 2 q4 + hh of this lane: running maxes m (of s) and n (of s + log2 vs), sum l of
    // 2^(s - m) over this lane's keys (summed over the 8 lanes of the same q4 at the end).
    float m[2] = {-INFINITY, -INFINITY}, n[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float acc[KS][4];  // O^T m-tile i: (dim g D/8 + 2i | + 1, head 2 q4 | 2 q4 + 1)
#pragma unroll
    for (int i = 0; i < KS; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.block_stride;
    for (int c = kb + warp * 16; c < ke; c += W * 16) {
        // K rows (keys c + g, c + g + 8): codes, K scale, log2 of the V scale.
        uint32_t kw[2][KW];
        float ksc[2], lvs[2];
        bool valid[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = c + g + 8 * r;
            valid[r] = key < ke;
            if (valid[r]) {
                const int64_t slot = cache_slot(p, table, key), scale = kvf8::scale_offset(p.g8, slot, kvh);
                load_words<KW, A16>(p.k8 + kvf8::code_offset(p.g8, slot, kvh) + q4 * (D / 4), kw[r]);
                ksc[r] = kvf8::scale_value(__ldg(reinterpret_cast<const unsigned short*>(p.k8 + scale)));
                lvs[r] = __log2f(kvf8::scale_value(__ldg(reinterpret_cast<const unsigned short*>(p.v8 + scale))));
            } else {
#pragma unroll
                for (int i = 0; i < KW; ++i) kw[r][i] = 0u;
                ksc[r] = 0.0f, lvs[r] = 0.0f;
            }
        }
        // V columns (keys c + 2 q4 + {0, 1, 8, 9}), dims g D/8 .. + D/8.
        uint32_t vw[4][VW];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int key = c + 2 * q4 + (j & 1) + 8 * (j >> 1);
            if (key < ke) {
                load_words<VW, A16>(p.v8 + kvf8::code_offset(p.g8, cache_slot(p, table, key), kvh) + g * (D / 8),
                                    vw[j]);
            } else {
#pragma unroll
                for (int i = 0; i < VW; ++i) vw[j][i] = 0u;
            }
        }

        // Scores: (key g | g + 8, head 2 q4 | 2 q4 + 1).
        float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const uint32_t a[4] = {f16x2_of(kw[0][ks]), f16x2_of(kw[1][ks]), f16x2_of(kw[0][ks] >> 16),
                                   f16x2_of(kw[1][ks] >> 16)};
            mma_f16_16816(sc, a, qf[ks][0], qf[ks][1]);
        }
        // Online softmax per head hh (over the 16 keys: this lane's two, the 8 lanes of its q4).
        uint32_t pt[2];  // P' rows (key g | g + 8), heads 2 q4 | 2 q4 + 1, f16x2
        float pv[2][2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float s0 = valid[0] ? sc[hh] * ksc[0] : -INFINITY;
            const float s1 = valid[1] ? sc[2 + hh] * ksc[1] : -INFINITY;
            const float e0 = s0 + lvs[0], e1 = s1 + lvs[1];
            float mx = fmaxf(s0, s1), nx = fmaxf(e0, e1);
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) {
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                nx = fmaxf(nx, __shfl_xor_sync(0xffffffffu, nx, off));
            }
            const float m_new = fmaxf(m[hh], mx), n_new = fmaxf(n[hh], nx);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: keep zeros
            const float n_use = n_new == -INFINITY ? 0.0f : n_new;
            l[hh] = l[hh] * exp2f(m[hh] - m_use) + exp2f(s0 - m_use) + exp2f(s1 - m_use);
            const float alpha = exp2f(n[hh] - n_use);
#pragma unroll
            for (int i = 0; i < KS; ++i) acc[i][hh] *= alpha, acc[i][2 + hh] *= alpha;
            pv[0][hh] = exp2f(e0 - n_use);
            pv[1][hh] = exp2f(e1 - n_use);
            m[hh] = m_new, n[hh] = n_new;
        }
        pt[0] = half2_bits(pv[0][0], pv[0][1]);
        pt[1] = half2_bits(pv[1][0], pv[1][1]);
        // P'^T fragments: (head g, keys 2 q4, 2 q4 + 1) and (head g, keys 8 + 2 q4, 9 + 2 q4).
        const uint32_t b0 = movmatrix_trans(pt[0]), b1 = movmatrix_trans(pt[1]);
#pragma unroll
        for (int i = 0; i < KS; ++i) {
            const int w = i >> 1;
            const uint32_t sel = (i & 1) ? 0x7362u : 0x5140u;  // dims 2, 3 | 0, 1 of word w, key pairs interleaved
            const uint32_t x01 = __byte_perm(vw[0][w], vw[1][w], sel);
            const uint32_t x89 = __byte_perm(vw[2][w], vw[3][w], sel);
            const uint32_t a[4] = {f16x2_of(x01), f16x2_of(x01 >> 16), f16x2_of(x89), f16x2_of(x89 >> 16)};
            mma_f16_16816(acc[i], a, b0, b1);
        }
    }

    // Warp totals per head: l over the 8 lanes of a q4; acc into m's units.
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], off);
        const float f = m[hh] == -INFINITY ? 0.0f : exp2f(n[hh] - m[hh]);
        const int h = 2 * q4 + hh;
#pragma unroll
        for (int i = 0; i < KS; ++i) {
            sm_acc[warp][h][g * (D / 8) + 2 * i] = acc[i][hh] * f;
            sm_acc[warp][h][g * (D / 8) + 2 * i + 1] = acc[i][2 + hh] * f;
        }
        if (g == 0) sm_m[warp][h] = m[hh], sm_l[warp][h] = l[hh];
    }
    __syncthreads();

    merge_decode_warps<W, kHeads, D>(p, slice, sm_m, sm_l, sm_acc, ws_ml, ws_acc);
}

template <int D, bool A16>
void launch_f8(const Params& p, const DecodeShape& sh, float* ws_ml, float* ws_acc, cudaStream_t stream) {
    const dim3 grid(sh.splits, p.num_kv_heads * sh.head_chunks, p.num_seqs);
    // Early (programmatic) launch for small batches only, as attention_decode.cu's kernels.
    if (p.num_seqs <= kClusterMaxSeqs)
        launch_pdl(decode_f8_mma_kernel<D, kWarpsF8, A16>, grid, dim3(kWarpsF8 * 32), 0, stream, p, sh.splits,
                   sh.head_chunks, ws_ml, ws_acc);
    else
        decode_f8_mma_kernel<D, kWarpsF8, A16>
            <<<grid, kWarpsF8 * 32, 0, stream>>>(p, sh.splits, sh.head_chunks, ws_ml, ws_acc);
    check_launch("decode_attention_fp8");
}

}  // namespace

bool decode_f8_mma_supports(int head_dim) {
    return head_dim == 64 || head_dim == 128;
}

DecodeShape decode_shape_f8(int num_seqs, int num_heads, int num_kv_heads, int max_context, int sm_count) {
    DecodeShape sh;
    const int group = num_heads / num_kv_heads;
    sh.group_max = kHeads;
    sh.head_chunks = (group + kHeads - 1) / kHeads;
    // About two 8-warp CTAs an SM in all (each SM holds two); short contexts at most 8 splits (a
    // longer combine), longer ones up to 16 so that batch 1 still covers the SMs. Depends on the
    // context only through short_decode_class, as the CUDA graphs are keyed.
    const int64_t units = std::max<int64_t>(1, static_cast<int64_t>(num_seqs) * num_kv_heads * sh.head_chunks);
    const int cap = short_decode_class(num_seqs, max_context) ? 8 : kMaxSplitsF8;
    sh.splits =
        static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(cap, 2 * static_cast<int64_t>(sm_count) / units)));
    sh.cluster = false;
    return sh;
}

void launch_decode_f8(const Params& p, const DecodeShape& sh, float* ws_ml, float* ws_acc, cudaStream_t stream) {
    const bool a16 = p.g8.block_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.k8) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(p.v8) % 16 == 0;
    switch (p.head_dim) {
        case 64:
            a16 ? launch_f8<64, true>(p, sh, ws_ml, ws_acc, stream)
                : launch_f8<64, false>(p, sh, ws_ml, ws_acc, stream);
            break;
        case 128:
            a16 ? launch_f8<128, true>(p, sh, ws_ml, ws_acc, stream)
                : launch_f8<128, false>(p, sh, ws_ml, ws_acc, stream);
            break;
        default:
            fail("decode_attention_fp8: head_dim ", p.head_dim, " takes the SIMT kernel");
    }
    if (sh.splits > 1) launch_decode_combine(p, sh.splits, ws_ml, ws_acc, stream);
}

}  // namespace peregrine::cuda::attn
