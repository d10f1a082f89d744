// Text for one request's outputs, made on the consumer's thread (RequestStream::next) instead
// of the engine's, as vLLM v1's OutputProcessor: per choice, incremental detokenization and
// stop strings. The engine core deals in token ids only (EOS, stop token ids, max_tokens).
//
// A stop string ends its choice here first. The output that completes it (text cut before the
// stop string, token ids up to the completing token) is held until the core confirms that the
// choice has ended (the caller asks it through EngineCore::stop_choice); tokens the engine drew
// for the choice meanwhile are dropped, and the request's usage counts only tokens delivered.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "engine/text_output.h"
#include "peregrine/engine_types.h"

namespace peregrine {

class RequestText {
  public:
    RequestText(const TextProcessor& text, const Request& request);

    // Fills `out.text` from its token ids (the core's output of one choice, in order).
    // Returns false when the output is to be dropped (its choice already ended on a stop string
    // and this is not the core's last output for it). Sets *stopped to the choice a stop string
    // has just ended (else -1): the caller asks the core to stop it.
    bool process(RequestOutput& out, int* stopped);

  private:
    struct Choice {
        std::unique_ptr<ChoiceText> text;
        int delivered = 0;                    // token ids handed to the consumer
        std::optional<RequestOutput> ending;  // held final output of a choice a stop string ended
        bool done = false;                    // its last output went out
    };
    Choice& choice(int index);

    const TextProcessor& processor_;
    std::vector<int32_t> prompt_;
    std::vector<std::string> stops_;
    bool skip_special_;
    std::vector<Choice> choices_;  // by choice index, created on first output
};

}  // namespace peregrine
