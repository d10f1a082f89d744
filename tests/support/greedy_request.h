// The request most engine tests build: greedy, a fixed number of tokens (EOS ignored), so that
// two runs are compared token for token.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "peregrine/engine_types.h"

namespace peregrine::testing {

inline Request greedy_request(std::string id, std::vector<int32_t> prompt, int max_tokens) {
    Request r;
    r.id = std::move(id);
    r.prompt_ids = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    return r;
}

}  // namespace peregrine::testing
