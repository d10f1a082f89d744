// Sequences for the block-manager tests: a prompt of `tokens`, nothing computed yet.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/sequence.h"

namespace peregrine {

inline Sequence seq_of(std::vector<int32_t> tokens, uint64_t id) {
    Sequence s;
    s.seq_id = id;
    s.tokens = std::move(tokens);
    s.num_prompt_tokens = s.num_tokens();
    return s;
}

}  // namespace peregrine
