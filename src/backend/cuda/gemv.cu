// Skinny products for decode: out[n, m] = x[n, k] . w[m, k]^T with n <= 4, bf16 in, f32
// accumulate. Memory-bound: every weight byte is read once, 16 bytes per lane per load with
// several loads in flight; the few x rows are read through L1/L2 (k <= 16K bf16 each).
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"

namespace peregrine::cuda {

namespace {

constexpr int kWarps = 4;        // warps per CTA, each over a quarter of k of the CTA's rows
constexpr int kRowsPerWarp = 2;  // rows a CTA walks together (more loads in flight)

__device__ __forceinline__ void unpack8(const uint4& v, float f[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

template <int N, bool OUT_F32>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const uint16_t* __restrict__ x,
                                                          const uint16_t* __restrict__ w, void* __restrict__ out,
                                                          int m, int k) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * kRowsPerWarp;
    float acc[kRowsPerWarp][N] = {};
    const int chunks = k / 8;  // 16-byte chunks per row, interleaved over all threads of the CTA
    for (int c = threadIdx.x; c < chunks; c += kWarps * 32) {
        uint4 wv[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
            wv[r] = row0 + r < m ? __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row0 + r) * k) + c)
                                 : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float xf[8];
            unpack8(__ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(j) * k) + c), xf);
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                float wf[8];
                unpack8(wv[r], wf);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(wf[e], xf[e], acc[r][j]);
            }
        }
    }
    __shared__ float part[kWarps][kRowsPerWarp][N];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float v = acc[r][j];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) part[warp][r][j] = v;
        }
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float v = 0;
#pragma unroll
            for (int q = 0; q < kWarps; ++q) v += part[q][r][j];
            if (lane == 0 && row0 + r < m) {
                const int64_t idx = static_cast<int64_t>(j) * m + row0 + r;
                if constexpr (OUT_F32) {
                    static_cast<float*>(out)[idx] = v;
                } else {
                    const __nv_bfloat16 h = __float2bfloat16_rn(v);
                    static_cast<uint16_t*>(out)[idx] = *reinterpret_cast<const uint16_t*>(&h);
                }
            }
        }
    }
}

template <int N>
void launch(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int m, int k, cudaStream_t stream) {
    const int rows_per_cta = kRowsPerWarp;
    const unsigned grid = static_cast<unsigned>((m + rows_per_cta - 1) / rows_per_cta);
    if (out_f32)
        gemv_kernel<N, true><<<grid, kWarps * 32, 0, stream>>>(x, w, out, m, k);
    else
        gemv_kernel<N, false><<<grid, kWarps * 32, 0, stream>>>(x, w, out, m, k);
}

}  // namespace

bool gemv_supported(int n, int k, const void* x, const void* w) {
    return n >= 1 && n <= kMaxGemvRows && k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void gemv(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int n, int m, int k, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    if (!gemv_supported(n, k, x, w)) fail("gemv: unsupported shape n ", n, " k ", k, " or misaligned operands");
    switch (n) {
        case 1: launch<1>(x, w, out, out_f32, m, k, stream); break;
        case 2: launch<2>(x, w, out, out_f32, m, k, stream); break;
        case 3: launch<3>(x, w, out, out_f32, m, k, stream); break;
        default: launch<4>(x, w, out, out_f32, m, k, stream); break;
    }
    check_launch("gemv");
}

}  // namespace peregrine::cuda
