// A model stand-in for engine tests: its "KV cache" stores token ids per slot, and the logits
// of a position are a hash of every token the sequence's block table reaches. A wrong slot,
// a stale block or a missed copy-on-write changes the logits, so outputs reveal them.
// With enable_device_sampling it also plays a GPU executor's sampling contract: logits stay
// inside, draws are launched then collected, and a batch may name the last launch's draws as
// its tokens (id -1 - i), as under async scheduling. With enable_host_tier it has a host KV tier
// of that many blocks (token ids per slot too), so a missed or misplaced onload shows the same way.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "worker/executor.h"

namespace peregrine::testing {

class FakeExecutor final : public ModelExecutor {
  public:
    FakeExecutor(int num_blocks, int block_size, int vocab = 97, int max_len = 512)
        : num_blocks_(num_blocks),
          block_size_(block_size),
          vocab_(vocab),
          max_len_(max_len),
          slots_(static_cast<size_t>(num_blocks) * block_size, -1) {}

    int vocab_size() const override { return vocab_; }
    int max_model_len() const override { return max_len_; }
    int num_kv_blocks() const override { return num_blocks_; }
    int block_size() const override { return block_size_; }

    void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override {
        for (const auto& [src, dst] : pairs)
            for (int i = 0; i < block_size_; ++i) slots_[dst * block_size_ + i] = slots_[src * block_size_ + i];
        copies_ += pairs.size();
    }

    void enable_host_tier(int slots) { host_.assign(static_cast<size_t>(slots) * block_size_, -1); }
    int num_host_kv_blocks() const override { return static_cast<int>(host_.size()) / block_size_; }
    size_t kv_block_bytes() const override { return static_cast<size_t>(block_size_) * sizeof(int32_t); }
    void* host_kv_data() override { return host_.empty() ? nullptr : host_.data(); }
    void offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override {
        for (const auto& [blk, slot] : pairs) {
            PG_CHECK(blk >= 0 && blk < num_blocks_ && slot >= 0 && slot < num_host_kv_blocks());
            for (int i = 0; i < block_size_; ++i) host_[slot * block_size_ + i] = slots_[blk * block_size_ + i];
        }
        offloaded_ += pairs.size();
        ++offload_calls_;
    }
    void onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) override {
        for (const auto& [slot, blk] : pairs) {
            PG_CHECK(blk >= 0 && blk < num_blocks_ && slot >= 0 && slot < num_host_kv_blocks());
            if (drop_onloads_) continue;
            for (int i = 0; i < block_size_; ++i) slots_[blk * block_size_ + i] = host_[slot * block_size_ + i];
        }
        onloaded_ += pairs.size();
        ++onload_calls_;
    }

    void execute(const BatchInput& b, std::vector<float>& logits) override {
        for (int t = 0; t < b.num_tokens(); ++t) {
            PG_CHECK(b.slot_mapping[t] >= 0 && b.slot_mapping[t] < static_cast<int>(slots_.size()));
            slots_[b.slot_mapping[t]] = b.token_ids[t];
        }
        tokens_ += b.num_tokens();
        logits.assign(b.logits_indices.size() * vocab_, 0.0f);
        size_t row = 0;
        for (int s = 0; s < b.num_seqs(); ++s) {
            const int last = b.query_start[s + 1] - 1;
            if (row >= b.logits_indices.size() || b.logits_indices[row] != last) continue;
            // Hash of the whole context as the cache holds it.
            uint64_t h = 1469598103934665603ull;
            for (int p = 0; p < b.context_lens[s]; ++p) {
                const int32_t blk = b.block_tables[s * b.max_blocks_per_seq + p / block_size_];
                PG_CHECK(blk >= 0 && blk < num_blocks_);
                h = (h ^ static_cast<uint64_t>(slots_[blk * block_size_ + p % block_size_] + 7)) * 1099511628211ull;
            }
            for (int v = 0; v < vocab_; ++v) {
                const uint64_t x = (h + v * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
                logits[row * vocab_ + v] = static_cast<float>((x >> 40) % 10007) / 1000.0f;
            }
            ++row;
        }
        ++steps_;
    }

    void enable_device_sampling(int max_fed_draws) {
        device_ = true;
        max_fed_ = max_fed_draws;
    }
    bool samples_on_device() const override { return device_; }
    int max_fed_draws() const override { return device_ ? max_fed_ : 0; }

    void execute_on_device(const BatchInput& b) override {
        PG_CHECK(device_);
        BatchInput resolved = b;
        for (int32_t& id : resolved.token_ids)
            if (id < 0) {
                PG_CHECK(-1 - id < static_cast<int>(draws_.size()), "token ", id, " names no draw of the last launch");
                id = draws_[-1 - id];
                ++fed_;
            }
        execute(resolved, logits_);
    }
    void launch_sampling(const std::vector<SampleRow>& rows) override {
        PG_CHECK(device_ && !launched_, "launch_sampling before the last launch was collected");
        launched_ = true;
        draws_.assign(rows.size(), 0);
        lps_.assign(rows.size(), TokenLogprob{});
        for (size_t i = 0; i < rows.size(); ++i) {
            // A real device sampler reads the history here (penalties): it must be known.
            for (std::span<const int32_t> part : {rows[i].prompt, rows[i].output})
                for (int32_t t : part) PG_CHECK(t >= 0, "a placeholder token reached the sampler");
            draws_[i] = sampler_.sample(logits_.data() + static_cast<size_t>(rows[i].logits_row) * vocab_, vocab_,
                                        rows[i], rows[i].num_logprobs >= 0 ? &lps_[i] : nullptr);
        }
    }
    void collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) override {
        PG_CHECK(launched_, "collect_samples without a launch");
        launched_ = false;
        tokens = draws_;
        logprobs = lps_;
    }

    size_t copies_ = 0;
    size_t steps_ = 0;
    size_t offloaded_ = 0, onloaded_ = 0;          // blocks moved to / from the host tier
    size_t offload_calls_ = 0, onload_calls_ = 0;  // calls (at most one each per step)
    bool drop_onloads_ = false;                    // a broken tier, for tests that must notice it
    size_t fed_ = 0;                               // tokens taken from draws on the "device"
    size_t tokens_ = 0;                            // tokens run through the model

  private:
    int num_blocks_, block_size_, vocab_, max_len_;
    std::vector<int32_t> slots_;  // [num_blocks * block_size] token id written at each slot
    std::vector<int32_t> host_;   // [host slots * block_size] the host tier's copies
    bool device_ = false, launched_ = false;
    int max_fed_ = 0;
    Sampler sampler_{{}};
    std::vector<float> logits_;  // the last execute_on_device's
    std::vector<int32_t> draws_;
    std::vector<TokenLogprob> lps_;
};

}  // namespace peregrine::testing
