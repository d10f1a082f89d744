// The typed request and answer of POST /v1/embeddings (OpenAI's shape): parse_embedding_params
// reads the body's JSON types; the handler (embeddings_handler.cc) checks what depends on the
// served model (dimensions, lengths, vocabulary) and runs the inputs through the engine.
#pragma once

#include <string>
#include <vector>

#include "server/openai/completion_request.h"
#include "server/openai/json.h"

namespace peregrine::server {

struct EmbeddingParams {
    std::string model;                // empty when the client left it out
    std::vector<PromptInput> inputs;  // `input`: texts or token-id lists, none empty
    bool base64 = false;              // encoding_format "base64" (else "float")
    int dimensions = 0;               // > 0: Matryoshka truncation to this many values; 0: all
    bool add_special_tokens = true;   // vLLM's extra field: the tokenizer's BOS/EOS rules for texts
    int priority = 0;                 // vLLM's extra field: lower runs first
};

// 400 naming the field for a missing or empty input, an empty string, a bad type, an unknown
// encoding_format or a dimensions that is not a positive integer. `user` is accepted and ignored.
EmbeddingParams parse_embedding_params(const Json& body);

// A vector's float32 values as little-endian bytes in base64: what the openai SDKs decode when
// they ask for encoding_format "base64" (their default).
std::string base64_f32(const std::vector<float>& v);

// {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...] or "..."}],
//  "model": model, "usage": {"prompt_tokens", "total_tokens"}}.
Json embeddings_json(const std::vector<std::vector<float>>& embeddings, bool base64, const std::string& model,
                     int prompt_tokens);

}  // namespace peregrine::server
