// FP8 (E4M3) quantization of bf16 rows: the weights at load (--quantization fp8) and a product's
// activations per token before an FP8 GEMM; and that GEMM's epilogue (both factor vectors). One CTA a row, by the rule
// of e4m3_rows.cuh (factor amax / 448, codes rounded to nearest even with saturation, as f32_to_f8e4m3 on the host).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/e4m3_rows.cuh"
#include "backend/cuda/pdl.cuh"

namespace peregrine::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf2f(uint16_t h) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// x [rows, cols] bf16 -> q [rows, cols] e4m3, scale [rows]; cols a multiple of 8 (16-byte loads).
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const uint16_t* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scale,
                         int64_t cols) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t row = blockIdx.x;
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);
    const int64_t chunks = cols / 8;
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
        const uint4 v = xr[c];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fmaxf(fabsf(bf2f(w[i] & 0xffffu)), fabsf(bf2f(w[i] >> 16))));
    }
    amax = e4m3_rows::block_amax(amax);
    const float inv = e4m3_rows::multiplier(amax);
    if (threadIdx.x == 0) scale[row] = e4m3_rows::factor(amax);
    uint2* qr = reinterpret_cast<uint2*>(q + row * cols);
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
        const uint4 v = xr[c];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        uint32_t out[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t lo = e4m3_rows::code(bf2f(w[i] & 0xffffu) * inv),
                           hi = e4m3_rows::code(bf2f(w[i] >> 16) * inv);
            out[i / 2] |= (lo | (hi << 8)) << (16 * (i % 2));
        }
        qr[c] = make_uint2(out[0], out[1]);
    }
}

// silu(gate) * up of a packed gate | up row (bf16 [rows, 2 dim]) rounded to bf16 as
// silu_mul_packed writes it, then quantized per row as quantize_rows_e4m3 would: one CTA a row,
// thread t taking 8-element vectors t + j * blockDim.x (NV of them, kept in registers).
template <int NV>
__global__ void __launch_bounds__(1024)
    silu_rows_e4m3_kernel(const uint16_t* __restrict__ gate_up, uint8_t* __restrict__ q, float* __restrict__ scale,
                          int64_t dim) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t row = blockIdx.x;
    const uint4* g = reinterpret_cast<const uint4*>(gate_up + row * 2 * dim);
    const uint4* u = reinterpret_cast<const uint4*>(gate_up + row * 2 * dim + dim);
    const int64_t nvec = dim / 8;
    float v[NV][8];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        const int64_t i = threadIdx.x + j * static_cast<int64_t>(blockDim.x);
        if (i >= nvec) continue;
        const uint4 gv = g[i], uv = u[i];
        const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float x = bf2f(static_cast<uint16_t>(gw[e / 2] >> (16 * (e % 2))));
            const float up = bf2f(static_cast<uint16_t>(uw[e / 2] >> (16 * (e % 2))));
            v[j][e] = bf2f(__bfloat16_as_ushort(__float2bfloat16_rn(x / (1.0f + expf(-x)) * up)));
            amax = fmaxf(amax, fabsf(v[j][e]));
        }
    }
    amax = e4m3_rows::block_amax(amax);
    const float inv = e4m3_rows::multiplier(amax);
    if (threadIdx.x == 0) scale[row] = e4m3_rows::factor(amax);
    uint2* qr = reinterpret_cast<uint2*>(q + row * dim);
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        const int64_t i = threadIdx.x + j * static_cast<int64_t>(blockDim.x);
        if (i >= nvec) continue;
        uint32_t out[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 8; ++e)
            out[e / 4] |= static_cast<uint32_t>(e4m3_rows::code(v[j][e] * inv)) << (8 * (e % 4));
        qr[i] = make_uint2(out[0], out[1]);
    }
}

// out[i, j] (+)= d[i, j] * w_scale[j] * x_scale[i] over [n, m]; V elements a thread-step.
template <int V>
__global__ void scale_product_kernel(const uint16_t* __restrict__ d, const float* __restrict__ w_scale,
                                     const float* __restrict__ x_scale, void* out, bool out_f32, bool accumulate,
                                     int64_t m, int64_t nvec) {
    pdl_launch_dependents();
    pdl_wait();
    for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < nvec;
         v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t at = v * V, row = at / m, col = at % m;  // m % V == 0: a vector stays in one row
        const float sx = x_scale[row];
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const float p = bf2f(d[at + e]) * w_scale[col + e] * sx;
            if (out_f32) {
                float* o = static_cast<float*>(out) + at + e;
                *o = accumulate ? *o + p : p;
            } else {
                uint16_t* o = static_cast<uint16_t*>(out) + at + e;
                const float prev = accumulate ? bf2f(*o) : 0.0f;
                *o = __bfloat16_as_ushort(__float2bfloat16_rn(prev + p));
            }
        }
    }
}

}  // namespace

void scale_fp8_product(const bf16_t* d, const float* w_scale, const float* x_scale, void* out, bool out_f32,
                       bool accumulate, int64_t n, int64_t m, cudaStream_t stream) {
    if (n <= 0 || m <= 0) return;
    const int64_t total = n * m;
    const int sms = sm_count();
    if (m % 4 == 0) {
        const int64_t nvec = total / 4;
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((nvec + 255) / 256, int64_t{sms} * 8));
        launch_pdl(scale_product_kernel<4>, blocks, 256, 0, stream, d, w_scale, x_scale, out, out_f32, accumulate, m,
                   nvec);
    } else {
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, int64_t{sms} * 8));
        launch_pdl(scale_product_kernel<1>, blocks, 256, 0, stream, d, w_scale, x_scale, out, out_f32, accumulate, m,
                   total);
    }
    check_launch("scale_fp8_product");
}

bool silu_rows_e4m3(const bf16_t* gate_up, uint8_t* q, float* scale, int64_t rows, int64_t dim, cudaStream_t stream) {
    const int64_t nvec = dim / 8;
    if (dim % 8 != 0 || nvec > 4 * 1024 || reinterpret_cast<uintptr_t>(gate_up) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(q) % 8 != 0)
        return false;
    if (rows <= 0) return true;
    // The fewest vectors a thread (1, 2 or 4) that 1024 threads cover the row with.
    const int nv = nvec <= 1024 ? 1 : nvec <= 2048 ? 2 : 4;
    const unsigned threads = static_cast<unsigned>(std::max<int64_t>(32, (nvec + nv - 1) / nv + 31) / 32 * 32);
    const unsigned grid = static_cast<unsigned>(rows);
    if (nv == 1)
        launch_pdl(silu_rows_e4m3_kernel<1>, grid, threads, 0, stream, gate_up, q, scale, dim);
    else if (nv == 2)
        launch_pdl(silu_rows_e4m3_kernel<2>, grid, threads, 0, stream, gate_up, q, scale, dim);
    else
        launch_pdl(silu_rows_e4m3_kernel<4>, grid, threads, 0, stream, gate_up, q, scale, dim);
    check_launch("silu_rows_e4m3");
    return true;
}

void quantize_rows_e4m3(const bf16_t* x, uint8_t* q, float* scale, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows <= 0) return;
    if (cols % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(q) % 8 != 0)
        fail("quantize_rows_e4m3: ", cols, " columns (a multiple of 8 needed) or misaligned operands");
    launch_pdl(quantize_rows_kernel, static_cast<unsigned>(rows), kThreads, 0, stream, x, q, scale, cols);
    check_launch("quantize_rows_e4m3");
}

}  // namespace peregrine::cuda
