// Rotary position embedding: the per-pair inverse frequencies every scaling kind reduces to.
#pragma once

#include <vector>

#include "model/model_config.h"

namespace peregrine {

struct RopeTable {
    std::vector<float> inv_freq;    // [rotary_dim / 2], radians per position
    float attention_factor = 1.0f;  // multiplies cos and sin (yarn), so q·k scales by its square
    int rotary_dim = 0;
    RopeStyle style = RopeStyle::Neox;
};

// Computed as Hugging Face's rope initialisers do (float32 inverse frequencies).
RopeTable make_rope_table(const RopeConfig& rope);

}  // namespace peregrine
