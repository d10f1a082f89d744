#include "engine/model_tokenizer.h"

#include "model/loader.h"
#include "tokenizer/tokenizer.h"

namespace peregrine {

std::shared_ptr<const Tokenizer> model_tokenizer(const EngineConfig& config, const LoadedModel& loaded) {
    if (!config.tokenizer.empty()) return std::make_shared<const Tokenizer>(Tokenizer::load(config.tokenizer));
    return std::make_shared<const Tokenizer>(loaded.gguf ? Tokenizer::from_gguf(*loaded.gguf)
                                                         : Tokenizer::load(loaded.model_dir));
}

}  // namespace peregrine
