// Skinny products for decode: out[n, m] = x[n, k] . w[m, k]^T with n <= 4, bf16 in, f32
// accumulate. Memory-bound: every weight byte is read once, 16 bytes per lane per load with
// several loads in flight; the few x rows are read through L1/L2 (k <= 16K bf16 each).
// The silu epilogue removes the SiLU·mul kernel after the gate | up product: a CTA takes rows i
// and m/2 + i and writes silu(gate_i) * up_i. (A residual-add + RMSNorm epilogue done by the
// last CTA to finish was tried and cost 10-20% of decode speed on an H100: not kept.)
#include <cuda_bf16.h>


#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda {

namespace {

constexpr int kWarps = 4;  // warps per CTA; k is interleaved over all the CTA's threads
constexpr int kThreads = kWarps * 32;

// Test hook (set_gemv_config): rows per CTA and chunks in flight (2x1, 2x2, 2x4, 1x4, 1x8); 0 = by k.
int g_rows = 0, g_depth = 0;

enum Epilogue { kPlain, kSilu };

__device__ __forceinline__ void unpack8(const uint4& v, float f[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ uint16_t to_bf16(float v) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    return *reinterpret_cast<const uint16_t*>(&h);
}

// One CTA per R output rows (silu: R == 2, rows i and m/2 + i). Each thread takes 16-byte
// chunks c = threadIdx.x + 128 j of every row and keeps D chunks per row in flight (a group),
// loading the next group while it multiplies the current one; the four warps' partial sums
// are added in a fixed order at the end.
template <int N, int R, int D, int EPI>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                                                        void* __restrict__ out, bool out_f32, int m, int k) {
    static_assert(EPI != kSilu || R == 2, "silu pairs a gate row with its up row");
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    auto row_of = [&](int r) {
        return EPI == kSilu ? static_cast<int>(blockIdx.x) + r * (m / 2) : static_cast<int>(blockIdx.x) * R + r;
    };
    float acc[R][N] = {};
    const int chunks = k / 8;  // 16-byte chunks per row
    auto load_group = [&](int base, uint4(&g)[D][R]) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = base + d * kThreads;
#pragma unroll
            for (int r = 0; r < R; ++r)
                g[d][r] = row_of(r) < m && c < chunks
                              ? __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row_of(r)) * k) + c)
                              : make_uint4(0, 0, 0, 0);
        }
    };
    // Under programmatic launch this runs while the previous kernel finishes: the first weight
    // group goes to registers and the rest of this CTA's rows towards L2 (weights are constant
    // during a step), then wait for x.
    pdl_launch_dependents();
    uint4 next[D][R];
    load_group(threadIdx.x, next);
    const int lines = (k * 2 + 127) / 128;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (row_of(r) >= m) break;
        const char* row = reinterpret_cast<const char*>(w + static_cast<int64_t>(row_of(r)) * k);
        for (int i = threadIdx.x; i < lines; i += kThreads)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(row + static_cast<int64_t>(i) * 128));
    }
    pdl_wait();
    for (int base = threadIdx.x; base < chunks; base += D * kThreads) {
        uint4 cur[D][R];
#pragma unroll
        for (int d = 0; d < D; ++d)
#pragma unroll
            for (int r = 0; r < R; ++r) cur[d][r] = next[d][r];
        load_group(base + D * kThreads, next);
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int c = base + d * kThreads;
            if (c >= chunks) break;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                float xf[8];
                unpack8(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(j) * k)[c],
                        xf);  // plain: written just before
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float wf[8];
                    unpack8(cur[d][r], wf);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(wf[e], xf[e], acc[r][j]);
                }
            }
        }
    }
    __shared__ float part[kWarps][R][N];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float v = acc[r][j];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) part[warp][r][j] = v;
        }
    }
    __syncthreads();
    auto total = [&](int r, int j) {
        float v = 0;
#pragma unroll
        for (int q = 0; q < kWarps; ++q) v += part[q][r][j];
        return v;
    };

    if constexpr (EPI == kSilu) {
        const int i = blockIdx.x, half = m / 2;
        if (threadIdx.x < N && i < half) {
            const int j = threadIdx.x;
            const float g = total(0, j), u = total(1, j);
            static_cast<uint16_t*>(out)[static_cast<int64_t>(j) * half + i] = to_bf16(g / (1.0f + expf(-g)) * u);
        }
        return;
    }
    if constexpr (EPI == kPlain) {
        // Thread t < R * N writes output (row t % R, token t / R).
        if (threadIdx.x >= R * N) return;
        const int r = threadIdx.x % R, j = threadIdx.x / R;
        if (row_of(r) >= m) return;
        const int64_t idx = static_cast<int64_t>(j) * m + row_of(r);
        if (out_f32)
            static_cast<float*>(out)[idx] = total(r, j);
        else
            static_cast<uint16_t*>(out)[idx] = to_bf16(total(r, j));
        return;
    }
}

template <int N, int R, int D, int EPI>
void launch_rd(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int m, int k, cudaStream_t stream) {
    const int blocks = EPI == kSilu ? m / 2 : (m + R - 1) / R;
    launch_pdl(gemv_kernel<N, R, D, EPI>, static_cast<unsigned>(blocks), kThreads, 0, stream, x, w, out, out_f32, m, k);
}

// Chunks in flight per thread by k (measured on an H100 over the Llama 1B/8B shapes,
// CudaGemvPerf.Report): rows up to 4096 long want two rows per CTA so there are enough loads
// at once, longer rows one row with deeper groups. set_gemv_config overrides it.
template <int N, int EPI>
void launch(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int m, int k, cudaStream_t stream) {
    int rows = k <= 4096 ? 2 : 1;
    int depth = k <= 2048 ? (N == 1 ? 2 : 1) : k <= 4096 ? 4 : 8;
    if (g_rows > 0) rows = g_rows, depth = g_depth;
    if constexpr (EPI == kSilu) {  // two rows per CTA by construction
        if (depth <= 1) return launch_rd<N, 2, 1, EPI>(x, w, out, out_f32, m, k, stream);
        if (depth == 2) return launch_rd<N, 2, 2, EPI>(x, w, out, out_f32, m, k, stream);
        return launch_rd<N, 2, 4, EPI>(x, w, out, out_f32, m, k, stream);
    } else {
        if (rows == 2 && depth == 2) return launch_rd<N, 2, 2, EPI>(x, w, out, out_f32, m, k, stream);
        if (rows == 2 && depth == 4) return launch_rd<N, 2, 4, EPI>(x, w, out, out_f32, m, k, stream);
        if (rows == 1 && depth == 4) return launch_rd<N, 1, 4, EPI>(x, w, out, out_f32, m, k, stream);
        if (rows == 1 && depth == 8) return launch_rd<N, 1, 8, EPI>(x, w, out, out_f32, m, k, stream);
        return launch_rd<N, 2, 1, EPI>(x, w, out, out_f32, m, k, stream);
    }
}

template <int EPI>
void dispatch(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int n, int m, int k, cudaStream_t stream) {
    switch (n) {
        case 1:
            launch<1, EPI>(x, w, out, out_f32, m, k, stream);
            break;
        case 2:
            launch<2, EPI>(x, w, out, out_f32, m, k, stream);
            break;
        case 3:
            launch<3, EPI>(x, w, out, out_f32, m, k, stream);
            break;
        default:
            launch<4, EPI>(x, w, out, out_f32, m, k, stream);
            break;
    }
}

void check_args(const char* what, int n, int k, const void* x, const void* w) {
    if (!gemv_supported(n, k, x, w)) fail(what, ": unsupported shape n ", n, " k ", k, " or misaligned operands");
}

}  // namespace

void set_gemv_config(int rows, int depth) {
    g_rows = rows;
    g_depth = depth;
}

bool gemv_supported(int n, int k, const void* x, const void* w) {
    return n >= 1 && n <= kMaxGemvRows && k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void gemv(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int n, int m, int k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    check_args("gemv", n, k, x, w);
    dispatch<kPlain>(x, w, out, out_f32, n, m, k, stream);
    check_launch("gemv");
}

void gemv_silu(const bf16_t* x, const bf16_t* w_gate_up, bf16_t* out, int n, int m, int k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    check_args("gemv_silu", n, k, x, w_gate_up);
    if (m % 2 != 0) fail("gemv_silu: ", m, " rows is not gate | up");
    dispatch<kSilu>(x, w_gate_up, out, false, n, m, k, stream);
    check_launch("gemv_silu");
}

}  // namespace peregrine::cuda
