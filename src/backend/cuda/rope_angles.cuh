// The per-token cos/sin table the RoPE kernels start from, and the rotation of one element.
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

// One rotated element of a pair, as the RoPE kernels compute it (separately rounded, no FMA, so
// every kernel writes the same bits): the pair's first element is own·c - partner·s, its second
// own·c + partner·s (own: this element's value, partner: the other element of the pair).
__device__ __forceinline__ float rope_rotate(float own, float partner, float c, float s, bool first) {
    return first ? __fsub_rn(__fmul_rn(own, c), __fmul_rn(partner, s))
                 : __fadd_rn(__fmul_rn(own, c), __fmul_rn(partner, s));
}
