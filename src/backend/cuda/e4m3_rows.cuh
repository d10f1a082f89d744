// The per-row E4M3 rule every FP8 GEMM input follows (quantize_rows_e4m3 and the kernels that
// write those inputs where they are made: rms_norm_e4m3, silu_rows_e4m3), so their codes agree
// bit for bit: a row's largest magnitude amax sets its factor amax / 448 (448 the largest finite
// e4m3); values are multiplied by 448 / amax and rounded to nearest even, saturating. An
// all-zero row keeps factor 0 and codes 0.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace peregrine::cuda::e4m3_rows {

__device__ __forceinline__ float multiplier(float amax) {
    return amax > 0.0f ? 448.0f / amax : 0.0f;
}
__device__ __forceinline__ float factor(float amax) {
    return amax / 448.0f;
}
__device__ __forceinline__ uint8_t code(float v) {  // v already multiplied
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
// The largest of every thread's amax in a CTA that holds one row (blockDim.x a multiple of 32,
// at most 1,024); every thread gets it.
__device__ __forceinline__ float block_amax(float amax) {
    __shared__ float warp_max[32];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_max[w]);
    return amax;
}

}  // namespace peregrine::cuda::e4m3_rows
