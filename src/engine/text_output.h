// The engine's view of text: per choice, turn each new token into a text delta and watch for
// stop strings. The tokenizer provides the implementation; the engine runs without one
// (token ids only) when it is absent.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace peregrine {

class ChoiceText {
  public:
    virtual ~ChoiceText() = default;
    // Adds one generated token. Returns the text that is now final: complete UTF-8, and
    // nothing that could still turn out to begin a stop string. When a stop string is
    // completed, sets `stop` to it, returns the text before it, and the choice ends.
    virtual std::string push(int32_t token, std::string* stop) = 0;
    // The choice ended for another reason: the text held back so far.
    virtual std::string flush() = 0;
};

class TextProcessor {
  public:
    virtual ~TextProcessor() = default;
    // `prompt` lets the detokenizer continue the prompt's text (leading-space rules);
    // `skip_special`: special tokens add no text.
    virtual std::unique_ptr<ChoiceText> start(const std::vector<int32_t>& prompt, const std::vector<std::string>& stops,
                                              bool skip_special) const = 0;
};

}  // namespace peregrine
