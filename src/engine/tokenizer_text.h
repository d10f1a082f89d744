// The engine's text side backed by a real tokenizer: incremental detokenization and stop
// strings for each choice.
#pragma once

#include <memory>

#include "engine/text_output.h"
#include "tokenizer/tokenizer.h"

namespace peregrine {

class TokenizerText final : public TextProcessor {
  public:
    explicit TokenizerText(std::shared_ptr<const Tokenizer> tokenizer) : tokenizer_(std::move(tokenizer)) {}
    std::unique_ptr<ChoiceText> start(const std::vector<int32_t>& prompt, const std::vector<std::string>& stops,
                                      bool skip_special) const override;

  private:
    std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace peregrine
