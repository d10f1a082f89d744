#include "engine/batch_builder.h"

#include <algorithm>

#include "engine/pooling.h"

namespace peregrine {

void build_batch(const SchedulerOutput& out, int block_size, BatchInput& b) {
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
    for (size_t i = 0; i < out.seqs.size(); ++i) {
        const Sequence& seq = *out.seqs[i].seq;
        const int begin = seq.num_computed, end = seq.num_computed + out.seqs[i].num_new;
        for (int pos = begin; pos < end; ++pos) {
            b.token_ids.push_back(seq.tokens[pos]);
            b.positions.push_back(pos);
            b.slot_mapping.push_back(seq.block_table[pos / block_size] * block_size + pos % block_size);
        }
        if (out.seqs[i].sample) b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
        if (seq.pooling) {  // one range per pooling sequence, possibly empty, in out.seqs order
            const auto [first, last] = pooled_positions(seq.pooling->type, begin, end, seq.num_tokens());
            const int32_t row0 = static_cast<int32_t>(b.token_ids.size()) - (end - begin);  // position `begin`
            b.pool_ranges.push_back(row0 + first - begin);
            b.pool_ranges.push_back(row0 + last - begin);
        }
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.context_lens.push_back(end);
        std::copy(seq.block_table.begin(), seq.block_table.end(), b.block_tables.begin() + i * max_blocks);
    }
}

}  // namespace peregrine
