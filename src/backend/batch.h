// One model step's input: every scheduled sequence's new tokens flattened into one batch,
// with no padding. Built by the ModelRunner (engine) or by simple drivers such as `generate`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace peregrine {

struct BatchInput {
    std::vector<int32_t> token_ids;     // [num_tokens]
    std::vector<int32_t> positions;     // [num_tokens] position of each token in its sequence
    std::vector<int32_t> query_start;   // [num_seqs + 1] sequence s owns tokens [query_start[s], query_start[s+1])
    std::vector<int32_t> context_lens;  // [num_seqs] tokens in the KV cache once this step is written
    std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq] KV block ids, -1 past the end
    int32_t max_blocks_per_seq = 0;
    std::vector<int32_t> slot_mapping;    // [num_tokens] cache slot (block * block_size + offset) to write
    std::vector<int32_t> logits_indices;  // token rows whose logits the step returns, in output order
    // Embeddings: [2 * k] token-row ranges [begin, end); Model::pool sums each range's final-normed
    // hidden states into its pooled row i. Empty for a step with no embedding sequence.
    std::vector<int32_t> pool_ranges;

    int num_tokens() const { return static_cast<int>(token_ids.size()); }
    int num_seqs() const { return static_cast<int>(context_lens.size()); }
    // Whether the step returns the logits of every token, in order (logits_indices = 0..n-1).
    bool logits_of_every_token() const {
        if (logits_indices.size() != token_ids.size()) return false;
        for (size_t i = 0; i < logits_indices.size(); ++i)
            if (logits_indices[i] != static_cast<int32_t>(i)) return false;
        return true;
    }
};

}  // namespace peregrine
