// The loaded model every transport serves: the engine and what the API needs beside it (the
// tokenizer for prompts and logprobs, the chat template, the context length).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "peregrine/engine.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::server {

struct ServedModel {
    std::shared_ptr<const Tokenizer> tokenizer;
    std::shared_ptr<const ChatTemplate> chat_template;  // null when the model has none
    std::string chat_template_error;                    // why it is null
    std::unique_ptr<Engine> engine;
    int max_model_len = 0;
    int vocab_size = 0;
    size_t max_token_bytes = 0;  // the longest token's text (set_model): bytes per token at most
    std::string path;
};

}  // namespace peregrine::server
