// The per-token cos/sin table both RoPE kernels start from.
#pragma once

// cs[0, half) = cos, cs[half, 2 half) = sin of position * inv_freq[i], times attention_factor,
// written by the CTA's threads (the caller synchronises). As the CPU backend (and Hugging Face):
// the angle is an f32 product, cos/sin are taken in double.
__device__ __forceinline__ void rope_angles(float* cs, float position, const float* __restrict__ inv_freq, int half,
                                            float attention_factor) {
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double angle = static_cast<double>(__fmul_rn(position, inv_freq[i]));
        double s, c;
        sincos(angle, &s, &c);
        cs[i] = __fmul_rn(static_cast<float>(c), attention_factor);
        cs[half + i] = __fmul_rn(static_cast<float>(s), attention_factor);
    }
}
