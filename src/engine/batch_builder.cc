#include "engine/batch_builder.h"

#include <algorithm>

#include "engine/pooling.h"

namespace peregrine {

void build_batch(const SchedulerOutput& out, int block_size, BatchInput& b,
                 std::vector<PromptLogprobRows>* prompt_rows) {
    b.token_ids.clear();
    b.positions.clear();
    b.slot_mapping.clear();
    b.logits_indices.clear();
    b.pool_ranges.clear();
    b.query_start.assign(1, 0);
    b.context_lens.clear();
    int max_blocks = 1;
    for (const ScheduledSeq& s : out.seqs)
        max_blocks = std::max(max_blocks, static_cast<int>(s.seq->block_table.size()));
    b.max_blocks_per_seq = max_blocks;
    b.block_tables.assign(out.seqs.size() * max_blocks, -1);
    if (prompt_rows) prompt_rows->clear();
    std::vector<int32_t> prompt_token_rows;  // appended to logits_indices after the sampled rows
    for (size_t i = 0; i < out.seqs.size(); ++i) {
        const Sequence& seq = *out.seqs[i].seq;
        const int begin = seq.num_computed, end = seq.num_computed + out.seqs[i].num_new;
        for (int pos = begin; pos < end; ++pos) {
            b.token_ids.push_back(seq.tokens[pos]);
            b.positions.push_back(pos);
            b.slot_mapping.push_back(seq.block_table[pos / block_size] * block_size + pos % block_size);
        }
        const int32_t row0 = static_cast<int32_t>(b.token_ids.size()) - (end - begin);  // position `begin`
        if (out.seqs[i].sample) b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
        if (const auto [first, last] = prompt_logprob_positions(seq, begin, end); prompt_rows && first < last) {
            prompt_rows->push_back({out.seqs[i].seq, first, last - first, static_cast<int>(prompt_token_rows.size())});
            for (int pos = first; pos < last; ++pos) prompt_token_rows.push_back(row0 + pos - begin);
        }
        if (seq.pooling) {  // one range per pooling sequence, possibly empty, in out.seqs order
            const auto [first, last] = pooled_positions(seq.pooling->type, begin, end, seq.num_tokens());
            b.pool_ranges.push_back(row0 + first - begin);
            b.pool_ranges.push_back(row0 + last - begin);
        }
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.context_lens.push_back(end);
        std::copy(seq.block_table.begin(), seq.block_table.end(), b.block_tables.begin() + i * max_blocks);
    }
    if (prompt_rows)
        for (PromptLogprobRows& r : *prompt_rows) r.first_row += static_cast<int>(b.logits_indices.size());
    b.logits_indices.insert(b.logits_indices.end(), prompt_token_rows.begin(), prompt_token_rows.end());
}

}  // namespace peregrine
