#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace peregrine {

namespace {

constexpr double kPi = 3.14159265358979323846;

double yarn_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension index whose wavelength makes `num_rotations` turns over `max_pos` positions.
double yarn_correction_dim(double num_rotations, int dim, double base, int max_pos) {
    return dim * std::log(max_pos / (num_rotations * 2 * kPi)) / (2 * std::log(base));
}

}  // namespace

RopeTable make_rope_table(const RopeConfig& rope) {
    RopeTable t;
    t.rotary_dim = rope.rotary_dim;
    t.style = rope.style;
    const int half = rope.rotary_dim / 2;
    t.inv_freq.resize(half);
    std::vector<float> base_freq(half);
    for (int i = 0; i < half; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(rope.rotary_dim);
        base_freq[i] = 1.0f / static_cast<float>(std::pow(rope.theta, static_cast<double>(exponent)));
    }

    switch (rope.scaling) {
        case RopeScaling::None:
            t.inv_freq = base_freq;
            break;
        case RopeScaling::Linear:
            for (int i = 0; i < half; ++i) t.inv_freq[i] = base_freq[i] / static_cast<float>(rope.factor);
            break;
        case RopeScaling::Llama3: {
            // Long wavelengths are divided by `factor`, short ones kept, and the band between
            // blended smoothly.
            const double old_ctx = rope.original_max_position;
            const double low_wavelen = old_ctx / rope.low_freq_factor;
            const double high_wavelen = old_ctx / rope.high_freq_factor;
            for (int i = 0; i < half; ++i) {
                const float f = base_freq[i];
                const double wavelen = 2 * kPi / f;
                float out = wavelen > low_wavelen ? f / static_cast<float>(rope.factor) : f;
                if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                    const double smooth =
                        (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
                    out = static_cast<float>((1 - smooth) * out / rope.factor + smooth * out);
                }
                t.inv_freq[i] = out;
            }
            break;
        }
        case RopeScaling::Yarn: {
            const int dim = rope.rotary_dim;
            double low = yarn_correction_dim(rope.beta_fast, dim, rope.theta, rope.original_max_position);
            double high = yarn_correction_dim(rope.beta_slow, dim, rope.theta, rope.original_max_position);
            if (rope.truncate) {
                low = std::floor(low);
                high = std::ceil(high);
            }
            low = std::max(low, 0.0);
            high = std::min(high, static_cast<double>(dim - 1));
            if (low == high) high += 0.001;
            for (int i = 0; i < half; ++i) {
                const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
                const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
                const double interp = base_freq[i] / rope.factor;
                t.inv_freq[i] = static_cast<float>(interp * (1 - extrapolation) + base_freq[i] * extrapolation);
            }
            double af = rope.attention_factor;
            if (af < 0) {
                af = (rope.mscale != 0 && rope.mscale_all_dim != 0)
                         ? yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
                         : yarn_mscale(rope.factor, 1.0);
            }
            t.attention_factor = static_cast<float>(af);
            break;
        }
    }
    if (!rope.freq_factors.empty()) {
        for (int i = 0; i < half; ++i) t.inv_freq[i] /= rope.freq_factors[i];
    }
    return t;
}

}  // namespace peregrine
