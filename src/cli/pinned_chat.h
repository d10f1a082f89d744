// Chat --pin-prefix files rendered as serve renders a chat request (EngineConfig::
// render_pinned_chat): the same template, the same content format, no generation prompt.
#pragma once

#include <string>

#include "peregrine/engine.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::cli {

// `messages_json`: the file's "messages" list as JSON text. `chat_template`: serve's
// --chat-template (a file or the template itself); empty: the model's (GGUF, else folder).
std::string render_pinned_chat(const std::string& messages_json, const std::string& chat_template,
                               const ModelInfo& model, const Tokenizer& tokenizer);

}  // namespace peregrine::cli
