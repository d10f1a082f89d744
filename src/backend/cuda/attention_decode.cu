// Decode attention (one query token per sequence): split-KV flash-decoding with GQA grouping.
//
// Grid (splits, num_kv_heads * head_chunks, num_seqs), 128 threads. One CTA reads one kv
// head's keys/values of one key range [kb, ke) of one sequence exactly once and serves up to
// GM query heads of that kv head with them. Inside the CTA the 4 warps take interleaved
// chunks of keys; inside a warp, L = D/8 lanes hold one key (16 bytes = 8 dims each), so one
// 16-byte load per lane brings KPL = 32/L keys, and U such loads are in flight per lane.
// Each KPL-lane group keeps its own online-softmax state (m, l, acc[8 dims] per head), merged
// across groups by shuffles and across warps through shared memory at the end.
//
// The key range of a CTA is its share of the sequence's [first, last] (read from device
// memory), cut at whole KV blocks, so the launch shape never depends on context lengths and
// can be captured in a CUDA graph. With splits > 1 each CTA writes (m, l, acc) partials and
// decode_combine_kernel merges them; with splits == 1 the CTA writes the output itself.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda::attn {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxSplits = 32;

template <int D, int GM>
__global__ void __launch_bounds__(kThreads, GM >= 8 ? 2 : 4)
    decode_kernel(const Params p, const int splits, const int head_chunks, float* __restrict__ ws_ml,
                  float* __restrict__ ws_acc) {
    constexpr int L = D / 8;            // lanes per key
    constexpr int KPL = 32 / L;         // keys per warp-wide load
    constexpr int U = GM >= 8 ? 2 : 4;  // loads in flight per lane (registers bound it)
    constexpr int CH = KPL * U;         // keys per warp iteration
    __shared__ float sm_m[kWarps][GM], sm_l[kWarps][GM];
    __shared__ float sm_acc[kWarps][GM][D];
    pdl_launch_dependents();
    pdl_wait();  // q, the cache and the batch arrays come from earlier work

    const int split = blockIdx.x;
    const int kvh = blockIdx.y / head_chunks;
    const int chunk = blockIdx.y - kvh * head_chunks;
    const int s = blockIdx.z;
    const int t = p.query_start[s];
    if (p.query_start[s + 1] - t != 1) return;  // a prefill sequence of a mixed batch (or none)
    const int h0 = kvh * p.group + chunk * GM;  // first query head of this CTA
    const int ng = min(GM, p.group - chunk * GM);
    const int ctx = p.context_lens[s];
    const int pos = p.positions[t];
    int first, last;
    key_range(p, pos, ctx, first, last);

    // This split's keys [kb, ke): an equal share of whole blocks.
    int kb = 0, ke = 0;
    if (last >= first) {
        const int b0 = first >> p.block_shift, b1 = (last >> p.block_shift) + 1;
        const int per = (b1 - b0 + splits - 1) / splits;
        kb = max(first, (b0 + split * per) << p.block_shift);
        ke = min(last + 1, (b0 + (split + 1) * per) << p.block_shift);
    }
    const int64_t row_stride = static_cast<int64_t>(p.num_heads) * D;
    if (kb >= ke) {  // nothing to read: an empty partial, or zeros when this CTA is the output
        if (splits == 1) {
            for (int i = threadIdx.x; i < ng * D; i += kThreads)
                p.out[t * row_stride + static_cast<int64_t>(h0) * D + i] = __float2bfloat16_rn(0.0f);
        } else if (threadIdx.x < ng) {
            const int64_t r = (static_cast<int64_t>(s) * p.num_heads + h0 + threadIdx.x) * splits + split;
            ws_ml[2 * r] = -INFINITY;
            ws_ml[2 * r + 1] = 0.0f;
        }
        return;
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gi = lane / L;  // key slot of this lane within a warp-wide load
    const int li = lane % L;  // which 8 dims of the key this lane holds

    // q of the CTA's heads, this lane's 8 dims, pre-scaled into log2 units.
    float q[GM][8];
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

    // Block ids of the next iteration's keys, loaded one iteration ahead (hides the table read).
    int c0 = kb + warp * CH;
    int blk[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int key = c0 + u * KPL + gi;
        blk[u] = key < ke ? __ldg(table + (key >> p.block_shift)) : 0;
    }
    for (; c0 < ke; c0 += kWarps * CH) {
        uint4 kr[U], vr[U];
        bool valid[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int key = c0 + u * KPL + gi;
            valid[u] = key < ke;
            const int64_t off = ((static_cast<int64_t>(blk[u]) << p.block_shift) + (key & bmask)) * slot_stride;
            kr[u] = valid[u] ? __ldg(reinterpret_cast<const uint4*>(kbase + off)) : make_uint4(0, 0, 0, 0);
            vr[u] = valid[u] ? __ldg(reinterpret_cast<const uint4*>(vbase + off)) : make_uint4(0, 0, 0, 0);
        }
        const int cn = c0 + kWarps * CH;
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
            unpack8(kr[u], kf);
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) a = fmaf(q[g][i], kf[i], a);
#pragma unroll
                for (int off = L / 2; off >= 1; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
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
                unpack8(vr[u], vf);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(pu, vf[i], acc[g][i]);
            }
            m[g] = m_new;
        }
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

    // Merge the warps: thread → (head g, dim d).
    for (int idx = threadIdx.x; idx < ng * D; idx += kThreads) {
        const int g = idx / D, d = idx - g * D;
        float mm = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, sm_m[w][g]);
        float ll = 0.0f, a = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float f = sm_m[w][g] == -INFINITY ? 0.0f : exp2f(sm_m[w][g] - mm);
            ll += sm_l[w][g] * f;
            a += sm_acc[w][g][d] * f;
        }
        if (splits == 1) {
            p.out[t * row_stride + (h0 + g) * D + d] = __float2bfloat16_rn(ll > 0.0f ? a / ll : 0.0f);
        } else {
            const int64_t r = (static_cast<int64_t>(s) * p.num_heads + h0 + g) * splits + split;
            ws_acc[r * D + d] = a;
            if (d == 0) ws_ml[2 * r] = mm, ws_ml[2 * r + 1] = ll;
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

template <int D, int GM>
void launch_dg(const Params& p, const DecodeShape& sh, float* ws_ml, float* ws_acc, cudaStream_t stream) {
    const dim3 grid(sh.splits, p.num_kv_heads * sh.head_chunks, p.num_seqs);
    // Early (programmatic) launch pays off for the few CTAs of small batches; for larger grids
    // the early CTAs land unevenly (b = 32, ctx 1024 on an H100: 38.6 us with it, 33.2 without).
    if (p.num_seqs <= 4)
        launch_pdl(decode_kernel<D, GM>, grid, dim3(kThreads), 0, stream, p, sh.splits, sh.head_chunks, ws_ml, ws_acc);
    else
        decode_kernel<D, GM><<<grid, kThreads, 0, stream>>>(p, sh.splits, sh.head_chunks, ws_ml, ws_acc);
    check_launch("decode_attention");
}

template <int D>
void launch_d(const Params& p, const DecodeShape& sh, float* ws_ml, float* ws_acc, cudaStream_t stream) {
    switch (sh.group_max) {
        case 1:
            return launch_dg<D, 1>(p, sh, ws_ml, ws_acc, stream);
        case 2:
            return launch_dg<D, 2>(p, sh, ws_ml, ws_acc, stream);
        case 4:
            return launch_dg<D, 4>(p, sh, ws_ml, ws_acc, stream);
        default:
            return launch_dg<D, 8>(p, sh, ws_ml, ws_acc, stream);
    }
}

}  // namespace

bool decode_supports(int head_dim) {
    return head_dim == 8 || head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

DecodeShape decode_shape(int num_seqs, int num_heads, int num_kv_heads, int sm_count) {
    DecodeShape sh;
    const int group = num_heads / num_kv_heads;
    sh.group_max = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
    sh.head_chunks = (group + sh.group_max - 1) / sh.group_max;
    // About two CTAs per SM in total, at most 8 splits: at batch 1 and short contexts more splits
    // only lengthen the combine (measured on an H200: 32 splits made the combine 8 us per layer).
    const int64_t units = static_cast<int64_t>(num_seqs) * num_kv_heads * sh.head_chunks;
    const int64_t target = 2 * static_cast<int64_t>(sm_count);
    sh.splits = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(std::min(kMaxSplits, 8), target / std::max<int64_t>(units, 1))));
    return sh;
}

void launch_decode(const Params& p, const DecodeShape& sh, float* ws_ml, float* ws_acc, cudaStream_t stream) {
    switch (p.head_dim) {
        case 8:
            launch_d<8>(p, sh, ws_ml, ws_acc, stream);
            break;
        case 16:
            launch_d<16>(p, sh, ws_ml, ws_acc, stream);
            break;
        case 32:
            launch_d<32>(p, sh, ws_ml, ws_acc, stream);
            break;
        case 64:
            launch_d<64>(p, sh, ws_ml, ws_acc, stream);
            break;
        case 128:
            launch_d<128>(p, sh, ws_ml, ws_acc, stream);
            break;
        case 256:
            launch_d<256>(p, sh, ws_ml, ws_acc, stream);
            break;
        default:
            fail("decode attention: unsupported head_dim ", p.head_dim);
    }
    if (sh.splits > 1) {
        const int64_t warps = static_cast<int64_t>(p.num_seqs) * p.num_heads;
        launch_pdl(decode_combine_kernel, dim3(static_cast<unsigned>((warps + 3) / 4)), dim3(128), 0, stream, p,
                   sh.splits, static_cast<const float*>(ws_ml), static_cast<const float*>(ws_acc));
        check_launch("decode_attention_combine");
    }
}

}  // namespace peregrine::cuda::attn
