// What a backend's RoPE kernels read: the per-pair inverse frequencies every scaling kind
// reduces to (model/rope.h computes them from a model's config).
#pragma once

#include <vector>

namespace peregrine {

// Which elements of a head form a rotation pair.
enum class RopeStyle {
    Neox,         // (i, i + rotary_dim/2): Hugging Face's rotate-half order
    Interleaved,  // (2i, 2i+1): Meta's order, which llama.cpp's converter uses for the `llama` arch
};

struct RopeTable {
    std::vector<float> inv_freq;    // [rotary_dim / 2], radians per position
    float attention_factor = 1.0f;  // multiplies cos and sin (yarn), so q·k scales by its square
    int rotary_dim = 0;
    RopeStyle style = RopeStyle::Neox;
};

}  // namespace peregrine
