#include "engine/model_runner.h"

#include <algorithm>

#include "backend/backend.h"
#include "core/error.h"
#include "model/kv_cache.h"
#include "model/llama.h"

namespace peregrine {

void ModelExecutor::execute_on_device(const BatchInput&) {
    fail("this executor samples on the CPU only");
}
void ModelExecutor::launch_sampling(const std::vector<SampleSpec>&) {
    fail("this executor samples on the CPU only");
}
void ModelExecutor::collect_samples(std::vector<int32_t>&, std::vector<TokenLogprob>&) {
    fail("this executor samples on the CPU only");
}

LlamaExecutor::LlamaExecutor(LlamaModel& model, Backend& backend, int num_blocks, int block_size,
                             DeviceSampler* sampler)
    : model_(model),
      backend_(backend),
      cache_(std::make_unique<KvCache>(backend, model.kv_cache_shape(num_blocks, block_size))),
      sampler_(sampler),
      device_logits_(std::make_unique<Tensor>()) {}

LlamaExecutor::~LlamaExecutor() = default;

int LlamaExecutor::vocab_size() const {
    return model_.config().vocab_size;
}
int LlamaExecutor::max_model_len() const {
    return model_.config().max_position_embeddings;
}
int LlamaExecutor::num_kv_blocks() const {
    return cache_->shape().num_blocks;
}
int LlamaExecutor::block_size() const {
    return cache_->shape().block_size;
}

void LlamaExecutor::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    if (pairs.empty()) return;
    for (int l = 0; l < cache_->shape().num_layers; ++l) {
        backend_.copy_blocks(cache_->k(l), pairs);
        backend_.copy_blocks(cache_->v(l), pairs);
    }
}

void LlamaExecutor::execute(const BatchInput& batch, std::vector<float>& logits) {
    model_.forward(batch, *cache_, logits);
}

void LlamaExecutor::execute_on_device(const BatchInput& batch) {
    *device_logits_ = model_.forward_device(batch, *cache_);
}

void LlamaExecutor::launch_sampling(const std::vector<SampleSpec>& specs) {
    PG_CHECK(sampler_ && !device_logits_->empty(), "launch_sampling without execute_on_device");
    sampler_->launch(*device_logits_, specs);
}

void LlamaExecutor::collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) {
    PG_CHECK(sampler_, "collect_samples without a device sampler");
    sampler_->collect(tokens, logprobs);
}

void build_batch(const SchedulerOutput& out, int block_size, BatchInput& b) {
    b.token_ids.clear();
    b.positions.clear();
    b.slot_mapping.clear();
    b.logits_indices.clear();
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
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.context_lens.push_back(end);
        std::copy(seq.block_table.begin(), seq.block_table.end(), b.block_tables.begin() + i * max_blocks);
    }
}

}  // namespace peregrine
