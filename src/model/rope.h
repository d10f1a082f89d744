// Rotary position embedding: a model's rope config -> the table its backend reads.
#pragma once

#include "backend/rope_table.h"
#include "model/model_config.h"

namespace peregrine {

// Computed as Hugging Face's rope initialisers do (float32 inverse frequencies).
RopeTable make_rope_table(const RopeConfig& rope);

}  // namespace peregrine
