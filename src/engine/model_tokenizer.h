// The tokenizer a loaded model runs with: --tokenizer when given, else the GGUF's vocabulary or
// the model folder's tokenizer.json.
#pragma once

#include <memory>

#include "peregrine/engine_config.h"

namespace peregrine {

class Tokenizer;
struct LoadedModel;

std::shared_ptr<const Tokenizer> model_tokenizer(const EngineConfig& config, const LoadedModel& loaded);

}  // namespace peregrine
