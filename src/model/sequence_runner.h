// Runs one sequence through a model with its own paged KV cache: the driver for `generate`
// and for golden tests. (The engine batches many sequences; this is the one-sequence case.)
#pragma once

#include <memory>
#include <vector>

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

}  // namespace peregrine
