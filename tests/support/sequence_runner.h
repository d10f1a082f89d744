// Runs one sequence through a model with its own paged KV cache, bypassing the engine: the
// golden tests' driver for exact logits of every position and for chunked prefill.
#pragma once

#include <memory>
#include <vector>

#include "core/error.h"
#include "model/kv_cache.h"
#include "model/llama.h"

namespace peregrine {

class SequenceRunner {
  public:
    // Room for `max_tokens` tokens in blocks of `block_size`.
    SequenceRunner(LlamaModel& model, Backend& backend, int max_tokens, int block_size = 16);

    // Appends `tokens` at the end of the sequence and runs them in one step. Returns the
    // logits of every new token ([tokens.size(), vocab]) when `all_logits`, else of the last.
    void run(const std::vector<int32_t>& tokens, bool all_logits, std::vector<float>& logits);

    int length() const { return length_; }
    int capacity() const { return capacity_; }
    void reset() { length_ = 0; }

  private:
    LlamaModel& model_;
    std::unique_ptr<KvCache> cache_;
    int block_size_;
    int capacity_;
    int length_ = 0;
    std::vector<int32_t> block_table_;
    BatchInput batch_;
};

inline SequenceRunner::SequenceRunner(LlamaModel& model, Backend& backend, int max_tokens, int block_size)
    : model_(model), block_size_(block_size) {
    const int num_blocks = (max_tokens + block_size - 1) / block_size;
    capacity_ = num_blocks * block_size;
    cache_ = std::make_unique<KvCache>(backend, model.kv_cache_shape(num_blocks, block_size));
    // Logical block i lives in physical block (num_blocks - 1 - i): the table is a real
    // indirection, never the identity.
    for (int i = 0; i < num_blocks; ++i) block_table_.push_back(num_blocks - 1 - i);
}

inline void SequenceRunner::run(const std::vector<int32_t>& tokens, bool all_logits, std::vector<float>& logits) {
    const int n = static_cast<int>(tokens.size());
    PG_CHECK(n > 0);
    if (length_ + n > capacity_) fail("sequence of ", length_ + n, " tokens exceeds the runner's ", capacity_);
    BatchInput& b = batch_;
    b.token_ids = tokens;
    b.positions.resize(n);
    b.slot_mapping.resize(n);
    for (int i = 0; i < n; ++i) {
        const int pos = length_ + i;
        b.positions[i] = pos;
        b.slot_mapping[i] = block_table_[pos / block_size_] * block_size_ + pos % block_size_;
    }
    b.query_start = {0, n};
    b.context_lens = {length_ + n};
    b.block_tables = block_table_;
    b.max_blocks_per_seq = static_cast<int32_t>(block_table_.size());
    b.logits_indices.clear();
    for (int i = all_logits ? 0 : n - 1; i < n; ++i) b.logits_indices.push_back(i);
    model_.forward(b, *cache_, logits);
    length_ += n;
}

}  // namespace peregrine
