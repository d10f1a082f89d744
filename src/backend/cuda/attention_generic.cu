// Generic paged attention: any head_dim (multiple of 8, <= 256), any batch shape, f32 math.
// The reference-like fallback for head dims without a fast kernel (the golden test models
// have 8, 16 and 32) and a cross-check of the fast kernels in tests.
//
// One warp per (token, query head), 4 warps per CTA. Keys in chunks of 32: lane j scores key
// kb + j against q (staged in shared memory), the warp updates an online softmax, then every
// lane accumulates its dims d = lane + 32·i of Σ p_j v_j over the chunk's keys. F8: the same,
// each key and value element read as its E4M3 code times its (token, head)'s scale.
#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda::attn {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxDim = 256;
constexpr int kDimsPerLane = kMaxDim / 32;

template <bool F8>
__global__ void __launch_bounds__(kWarps * 32) generic_kernel(const Params p) {
    __shared__ float q_sh[kWarps][kMaxDim];
    pdl_launch_dependents();
    pdl_wait();  // q, the cache and the batch arrays come from earlier work
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    if (gw >= static_cast<int64_t>(p.num_tokens) * p.num_heads) return;
    const int t = static_cast<int>(gw / p.num_heads), h = static_cast<int>(gw % p.num_heads);
    const int D = p.head_dim;
    __nv_bfloat16* out = p.out + static_cast<int64_t>(t) * p.num_heads * D + static_cast<int64_t>(h) * D;

    // Sequence of token t: the last s with query_start[s] <= t (query_start is non-decreasing).
    int lo = 0, hi = p.num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (p.query_start[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int s = lo;
    int first, last;
    if (t >= p.query_start[s + 1]) {  // not in any sequence (should not happen): zeros
        first = 0, last = -1;
    } else {
        key_range(p, p.positions[t], p.context_lens[s], first, last);
    }

    const __nv_bfloat16* q = p.q + static_cast<int64_t>(t) * p.num_heads * D + static_cast<int64_t>(h) * D;
    for (int d = lane; d < D; d += 32) q_sh[warp][d] = __bfloat162float(q[d]) * p.scale;
    __syncwarp();

    const int kvh = h / p.group;
    const int32_t* table = p.block_tables + static_cast<int64_t>(s) * p.block_stride;
    float m = -INFINITY, l = 0.0f, acc[kDimsPerLane];
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.0f;

    for (int kb = first; kb <= last; kb += 32) {  // uniform across the warp
        const int key = kb + lane;
        const bool valid = key <= last;
        // bf16: the element offset of the key's head; F8: its cache slot.
        const int64_t off = valid ? (F8 ? cache_slot(p, table, key) : cache_offset(p, table, key, kvh)) : 0;
        float sc = -INFINITY;
        if (valid) {
            float a = 0.0f;
            if constexpr (F8) {
                const uint2* kp = reinterpret_cast<const uint2*>(p.k8 + kvf8::code_offset(p.g8, off, kvh));
                const float ks = kvf8::load_scale(p.k8, kvf8::scale_offset(p.g8, off, kvh));
                for (int c = 0; c < D / 8; ++c) {
                    float kf[8];
                    kvf8::dequant8(__ldg(kp + c), ks, kf);
#pragma unroll
                    for (int i = 0; i < 8; ++i) a = fmaf(q_sh[warp][c * 8 + i], kf[i], a);
                }
            } else {
                const uint4* kp = reinterpret_cast<const uint4*>(p.k_cache + off);
                for (int c = 0; c < D / 8; ++c) {
                    float kf[8];
                    unpack8(__ldg(kp + c), kf);
#pragma unroll
                    for (int i = 0; i < 8; ++i) a = fmaf(q_sh[warp][c * 8 + i], kf[i], a);
                }
            }
            sc = a;
        }
        float mx = sc;
        for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(m, mx);  // finite: lane 0's key is valid
        const float alpha = expf(m - m_new);
        const float pj = valid ? expf(sc - m_new) : 0.0f;
        float ps = pj;
        for (int o = 16; o >= 1; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * alpha + ps;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= alpha;
        const int n = min(32, last - kb + 1);
        for (int j = 0; j < n; ++j) {
            const float pjj = __shfl_sync(0xffffffffu, pj, j);
            const int64_t oj = __shfl_sync(0xffffffffu, off, j);
            if constexpr (F8) {
                const uint8_t* v = p.v8 + kvf8::code_offset(p.g8, oj, kvh);
                const float vs = kvf8::load_scale(p.v8, kvf8::scale_offset(p.g8, oj, kvh));
#pragma unroll
                for (int i = 0; i < kDimsPerLane; ++i) {
                    const int d = lane + 32 * i;
                    if (d < D) acc[i] = fmaf(pjj, kvf8::value(v[d]) * vs, acc[i]);
                }
            } else {
                const __nv_bfloat16* v = p.v_cache + oj;
#pragma unroll
                for (int i = 0; i < kDimsPerLane; ++i) {
                    const int d = lane + 32 * i;
                    if (d < D) acc[i] = fmaf(pjj, __bfloat162float(v[d]), acc[i]);
                }
            }
        }
        m = m_new;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < D) out[d] = __float2bfloat16_rn(acc[i] * inv);
    }
}

}  // namespace

void launch_generic(const Params& p, cudaStream_t stream) {
    const int64_t warps = static_cast<int64_t>(p.num_tokens) * p.num_heads;
    if (warps == 0) return;
    const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps));
    if (p.k8 != nullptr)
        launch_pdl(generic_kernel<true>, grid, dim3(kWarps * 32), 0, stream, p);
    else
        launch_pdl(generic_kernel<false>, grid, dim3(kWarps * 32), 0, stream, p);
    check_launch("generic_attention");
}

}  // namespace peregrine::cuda::attn
