// Hugging Face config.json (+ generation_config.json) → ModelConfig.
#pragma once

#include <string>

#include "model/model_config.h"

namespace peregrine {

// `dir` is a model folder. Throws Error naming the file and key on anything missing or unknown.
ModelConfig read_hf_config(const std::string& dir);

}  // namespace peregrine
