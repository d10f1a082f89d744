// The loaded model every transport serves: the engine and what the API needs beside it (the
// tokenizer for prompts and logprobs, the chat template, the context length).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "peregrine/engine.h"
#include "server/openai/tool_parsers.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::server {

struct ServedModel {
    std::shared_ptr<const Tokenizer> tokenizer;
    std::shared_ptr<const ChatTemplate> chat_template;  // null when the model has none
    std::string chat_template_error;                    // why it is null
    // How message content reaches a template: "string" (text parts joined) or "openai" (a list
    // of {"type": "text", "text": ...} parts), as --chat-template-content-format resolved it.
    std::string chat_template_content_format = "string";
    // bos_token / eos_token of a request's own chat_template: the model template's, else the tokenizer's.
    std::string bos_token, eos_token;
    // Where the sampling fields of a request start (the model's generation_config.json).
    SamplingParams request_defaults;
    std::unique_ptr<Engine> engine;
    int max_model_len = 0;
    int vocab_size = 0;
    int hidden_size = 0;  // an embedding's values (dimensions may ask for fewer)
    // serve --task embed: the pooling of /v1/embeddings (ModelInfo::pooling); unset: a server that
    // generates, which refuses /v1/embeddings (and an embedding server refuses completions).
    std::optional<PoolingParams> pooling;
    size_t max_token_bytes = 0;  // the longest token's text (set_model): bytes per token at most
    // How tool_choice "auto" finds calls in the answer (serve --tool-call-parser, by default from
    // the chat template); None: the answer is content.
    ToolCallFormat tool_call_format = ToolCallFormat::None;
    std::string path;
};

}  // namespace peregrine::server
