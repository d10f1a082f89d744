// The steps the tensor / pipeline parallel tests run on every rank and on one rank: two
// sequences prefilled together (every token's logits), then one decode step of each, in a
// cache of 16 blocks of 16 tokens (8 per sequence). They exercise what a real step does:
// several sequences, chunk positions, cache reads.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/batch.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace peregrine::testing {

inline BatchInput two_sequence_step(bool decode) {
    const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407, 261, 378}, {1, 9, 77}};
    const std::vector<int32_t> next = {42, 300};
    BatchInput b;
    b.max_blocks_per_seq = 8;
    b.query_start.push_back(0);
    for (size_t s = 0; s < prompts.size(); ++s) {
        const int first = decode ? static_cast<int>(prompts[s].size()) : 0;
        const int count = decode ? 1 : static_cast<int>(prompts[s].size());
        for (int i = 0; i < count; ++i) {
            const int pos = first + i;
            b.token_ids.push_back(decode ? next[s] : prompts[s][i]);
            b.positions.push_back(pos);
            b.slot_mapping.push_back((static_cast<int>(s) * 8 + pos / 16) * 16 + pos % 16);
            b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
        }
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.context_lens.push_back(first + count);
        for (int k = 0; k < 8; ++k) b.block_tables.push_back(static_cast<int32_t>(s) * 8 + k);
    }
    return b;
}

// The prefill's and the decode's logits, one after the other: [10, vocab] (with pipeline
// stages: empty except on rank 0, the first stage's tensor-parallel rank 0).
inline std::vector<float> run_two_sequence_steps(Model& model, Backend& backend) {
    KvCache cache(backend, model.kv_cache_shape(16, 16));
    std::vector<float> all, logits;
    for (const bool decode : {false, true}) {
        model.forward(two_sequence_step(decode), cache, logits);
        all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
}

}  // namespace peregrine::testing
