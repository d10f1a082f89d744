// --pin-prefix files (EngineConfig::pin_prefix) as token ids: the system prompts the engine
// prefills at start and keeps in the KV cache for good (EngineCore::pin_prefix).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "peregrine/engine.h"
#include "tokenizer/tokenizer.h"

namespace peregrine {

// Each file: a JSON object {"messages": [...]} is rendered by `render_chat` (the chat template)
// and tokenized as a chat request's prompt is (no added special tokens: the template writes
// them); anything else is plain text, tokenized as a completion prompt is (BOS added). Throws
// Error naming the file when it cannot be read, is empty, is a JSON object without a non-empty
// "messages" list, needs a renderer there is none of, or the renderer fails.
std::vector<std::vector<int32_t>> pinned_prefix_tokens(const std::vector<std::string>& files,
                                                       const EngineConfig& config, const ModelInfo& model,
                                                       const Tokenizer& tokenizer);

}  // namespace peregrine
