#include "model/llama.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace peregrine {

namespace {
// A [rows, cols] view of the first rows of a workspace buffer.
Tensor view(const Tensor& buf, int64_t rows, int64_t cols) {
    return Tensor(buf.data, buf.dtype, {rows, cols}, buf.device);
}

// Places the weights through the backend, which chooses each layer's layout (place_layer).
// Layers [first, first + count) only: a pipeline stage places its own. A lazy load's layers are
// made here one at a time (LoadedModel::make_layer) and what placing did not keep released.
ModelWeights place_weights(const LoadedModel& model, Backend& backend, int first, int count) {
    const ModelWeights& w = model.weights;
    const ModelConfig& c = model.config;
    auto vec = [&](const Tensor& t) { return t.empty() ? t : backend.place_weight(t, false); };
    ModelWeights out;
    const bool tied = !w.lm_head.empty() && w.lm_head.data == w.embed.data;
    out.embed = w.embed.empty() ? w.embed : backend.place_embedding(w.embed, tied);
    out.final_norm = vec(w.final_norm);
    // A tied head is the embedding's placement; an untied one may stay in a product-only layout.
    out.lm_head = w.lm_head.empty() ? w.lm_head
                  : tied            ? backend.place_tied_head(out.embed)
                                    : backend.place_lm_head(w.lm_head);
    for (int i = first; i < first + count; ++i) {
        const LayerWeights made = model.make_layer ? model.make_layer(i) : w.layers[i];
        LayerWeights host = made;
        if (!c.qk_norm) host.q_norm = host.k_norm = Tensor();  // the blocks apply qk-norm where these are set
        out.layers.push_back(backend.place_layer(host));
        if (model.layer_placed) model.layer_placed(made, out.layers.back());
    }
    return out;
}
}  // namespace

LlamaModel::LlamaModel(const LoadedModel& model, Backend& backend, const ModelParallel& par)
    : config_(model.config), backend_(backend), tp_(par.tp), pp_(par.pp), rope_(make_rope_table(model.config.rope)) {
    const StageLayers stage = stage_layers(config_.num_layers, pp_ ? pp_->rank() : 0, pp_ ? pp_->size() : 1);
    first_layer_ = stage.first;
    num_stage_layers_ = stage.count;
    weights_ = place_weights(model, backend, stage.first, stage.count);
    Communicator* tp = tp_;
    const int size = tp ? tp->size() : 1, rank = tp ? tp->rank() : 0;
    if (config_.tp.size != size || config_.tp.rank != rank)
        fail("the model was loaded for tensor-parallel rank ", config_.tp.rank, " of ", config_.tp.size,
             ", but runs as rank ", rank, " of ", size);
}

LlamaModel::~LlamaModel() {
    free_workspace();
}

KvCacheShape LlamaModel::kv_cache_shape(int num_blocks, int block_size) const {
    return {num_stage_layers_,    num_blocks,       block_size,
            config_.num_kv_heads, config_.head_dim, backend_.kv_cache_dtype()};
}

void LlamaModel::free_workspace() {
    for (Tensor* t : {&ws_.residual, &ws_.logits, &ws_.local, &ws_.gather_send, &ws_.gather_recv})
        if (!t->empty()) backend_.release(*t);
    ws_.capacity = ws_.logit_rows = 0;
}

void LlamaModel::reserve(int64_t tokens, int64_t logit_rows) {
    if (tokens <= ws_.capacity && logit_rows <= ws_.logit_rows) return;
    tokens = std::max(tokens, ws_.capacity);
    logit_rows = std::max(logit_rows, ws_.logit_rows);
    backend_.forget_steps();  // recordings hold the old buffers' addresses
    free_workspace();
    ws_.residual = backend_.allocate(DType::F32, {tokens, config_.hidden_size});
    ws_.logits = backend_.allocate(DType::F32, {logit_rows, config_.vocab_size});
    if (sharded()) {
        // all_gather takes equal counts: each rank sends its slice padded to the widest (the
        // last rank's, V / T + V % T columns).
        const int64_t T = tp_->size(), width = config_.vocab_size / T + config_.vocab_size % T;
        ws_.local = backend_.allocate(DType::F32, {logit_rows, config_.vocab_rows()});
        ws_.gather_send = backend_.allocate(DType::F32, {logit_rows, width});
        ws_.gather_recv = backend_.allocate(DType::F32, {T * logit_rows, width});
    }
    ws_.capacity = tokens;
    ws_.logit_rows = logit_rows;
}

void LlamaModel::pad_decode_batch(const BatchInput& b, int bucket, BatchInput& p) const {
    const int n = b.num_seqs();
    p.token_ids = b.token_ids;
    p.positions = b.positions;
    p.slot_mapping = b.slot_mapping;
    p.query_start = b.query_start;
    p.context_lens = b.context_lens;
    p.max_blocks_per_seq = b.max_blocks_per_seq;
    p.block_tables = b.block_tables;
    p.token_ids.resize(bucket, 0);
    p.positions.resize(bucket, 0);
    p.slot_mapping.resize(bucket, -1);  // padding tokens write nothing
    p.context_lens.resize(bucket, 0);   // and attend to nothing
    for (int s = n; s < bucket; ++s) p.query_start.push_back(s + 1);
    p.block_tables.resize(static_cast<size_t>(bucket) * b.max_blocks_per_seq, -1);
    p.logits_indices.resize(bucket);
    for (int s = 0; s < bucket; ++s) p.logits_indices[s] = s;
}

Tensor LlamaModel::forward_device(const BatchInput& batch, KvCache& cache) {
    const int64_t n = batch.num_tokens();
    const int64_t num_logits = static_cast<int64_t>(batch.logits_indices.size());
    PG_CHECK(n > 0 && static_cast<int64_t>(batch.positions.size()) == n &&
             static_cast<int64_t>(batch.slot_mapping.size()) == n);
    PG_CHECK(cache.shape().num_layers == num_stage_layers_ && cache.shape().head_dim == config_.head_dim);

    // A decode-only step (one token per sequence, every one sampled in order) may be replayed
    // from a recording made for its padded size.
    const bool decode = n == batch.num_seqs() && batch.logits_of_every_token() && batch.pool_ranges.empty();
    const int bucket = decode ? backend_.step_bucket(batch.num_seqs()) : -1;
    const BatchInput* run = &batch;
    if (bucket > 0) {
        pad_decode_batch(batch, bucket, padded_);
        run = &padded_;
    }
    reserve(run->num_tokens(), std::max<int64_t>(static_cast<int64_t>(run->logits_indices.size()), 1));
    if (bucket > 0) {  // recordings write the cache they were made with
        cache_ptrs_.clear();
        for (int l = 0; l < num_stage_layers_; ++l) {
            cache_ptrs_.push_back(cache.k(l).data);
            cache_ptrs_.push_back(cache.v(l).data);
        }
        if (cache_ptrs_ != recorded_cache_) {
            backend_.forget_steps();
            recorded_cache_ = cache_ptrs_;
        }
    }
    backend_.begin_step(*run);
    // (A replayed recording does not call the lambda: the logits are where run_ops puts them.)
    backend_.run_step(bucket, [&] { run_ops(*run, cache); });
    if (num_logits == 0 || !holds_logits()) return Tensor();
    // Padding rows come last: the real ones are the first num_logits.
    return view(ws_.logits, num_logits, config_.vocab_size);
}

void LlamaModel::forward(const BatchInput& batch, KvCache& cache, std::vector<float>& logits) {
    const Tensor out = forward_device(batch, cache);
    if (out.empty()) {
        logits.clear();
        return;
    }
    logits.resize(static_cast<size_t>(out.numel()));
    backend_.download(out, logits.data());
}

Tensor LlamaModel::run_ops(const BatchInput& batch, KvCache& cache) {
    const ModelConfig& c = config_;
    const int64_t n = batch.num_tokens();
    const int64_t num_logits = static_cast<int64_t>(batch.logits_indices.size());
    const Tensor residual = view(ws_.residual, n, c.hidden_size);  // the residual stream

    AttentionParams attn;
    attn.num_heads = c.num_heads;
    attn.num_kv_heads = c.num_kv_heads;
    attn.head_dim = c.head_dim;
    attn.norm_eps = c.rms_norm_eps;
    attn.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    attn.rope = &rope_;

    attn.tp = tp_;

    const size_t stream = static_cast<size_t>(n * c.hidden_size);  // residual elements
    if (!first_stage())
        pp_->recv(residual.data, stream, DType::F32, pp_->rank() - 1);
    else if (sharded())
        embed_sharded(batch, residual);
    else
        backend_.embedding(weights_.embed, batch.token_ids.data(), n, residual, 0);
    for (int l = 0; l < num_stage_layers_; ++l) {  // cache and weights: this stage's layers
        const LayerWeights& w = weights_.layers[l];
        attn.window = c.layer_window[first_layer_ + l];
        backend_.attention_block(residual, w, attn, batch, cache.k(l), cache.v(l));
        backend_.mlp_block(residual, w, c.rms_norm_eps, tp_);
    }
    const Tensor out = view(ws_.logits, num_logits, c.vocab_size);
    const size_t logit_count = static_cast<size_t>(num_logits * c.vocab_size);
    if (!last_stage()) {
        pp_->send(residual.data, stream, DType::F32, pp_->rank() + 1);
        // The first stage's tensor-parallel rank 0 gets the logits back from the last stage.
        if (num_logits == 0 || !holds_logits()) return Tensor();
        pp_->recv(out.data, logit_count, DType::F32, pp_->size() - 1);
        return out;
    }
    if (num_logits == 0) return Tensor();
    // The final norm and LM head, only for the rows whose logits are wanted.
    if (sharded()) {
        const Tensor local = view(ws_.local, num_logits, c.vocab_rows());
        backend_.logits(residual, weights_.final_norm, c.rms_norm_eps, weights_.lm_head, batch, local);
        gather_logits(local, out);
    } else {
        backend_.logits(residual, weights_.final_norm, c.rms_norm_eps, weights_.lm_head, batch, out);
    }
    if (!holds_logits()) {  // a last stage: column 0 hands them to the first stage's rank
        if (tp_rank() == 0) pp_->send(out.data, logit_count, DType::F32, 0);
        return Tensor();
    }
    return out;
}

void LlamaModel::embed_sharded(const BatchInput& batch, const Tensor& residual) {
    const int64_t n = batch.num_tokens(), H = config_.hidden_size;
    // This rank's rows; zeros for the other ranks' tokens, which they fill in.
    backend_.embedding(weights_.embed, batch.token_ids.data(), n, residual, config_.vocab_begin());
    tp_->all_reduce_sum(residual.data, static_cast<size_t>(n * H), DType::F32);
}

// Every rank's slice [rows, its vocabulary rows] padded to `width` columns, all-gathered
// (rank-major: [T, rows, width]), then laid side by side in `out` [rows, vocab]. Device copies
// only, so the gather runs inside a recorded step.
void LlamaModel::gather_logits(const Tensor& local, const Tensor& out) {
    const int64_t rows = local.rows(), V = config_.vocab_size, T = tp_->size(), base = V / T;
    const int64_t width = ws_.gather_send.cols();
    const Tensor send = view(ws_.gather_send, rows, width);
    backend_.copy_columns(local, 0, send, 0, rows, local.cols());
    const Tensor recv = view(ws_.gather_recv, T * rows, width);
    tp_->all_gather(send.data, recv.data, static_cast<size_t>(rows * width), DType::F32);
    for (int64_t t = 0; t < T; ++t) {
        const int64_t begin = t * base, cols = (t == T - 1 ? V : (t + 1) * base) - begin;
        const Tensor block(static_cast<float*>(recv.data) + t * rows * width, DType::F32, {rows, width}, recv.device);
        backend_.copy_columns(block, 0, out, begin, rows, cols);
    }
}

}  // namespace peregrine
