#include "model/llama.h"

#include <cmath>

#include "core/error.h"

namespace peregrine {

namespace {
// A [rows, cols] view of the first rows of a workspace buffer.
Tensor view(const Tensor& buf, int64_t rows, int64_t cols) {
    return Tensor(buf.data, buf.dtype, {rows, cols}, buf.device);
}

ModelWeights place_weights(const ModelWeights& w, Backend& backend) {
    auto matrix = [&](const Tensor& t) { return t.empty() ? t : backend.place_weight(t, true); };
    auto vec = [&](const Tensor& t) { return t.empty() ? t : backend.place_weight(t, false); };
    ModelWeights out;
    out.embed = matrix(w.embed);
    out.final_norm = vec(w.final_norm);
    out.lm_head = matrix(w.lm_head);
    for (const LayerWeights& l : w.layers) {
        LayerWeights p;
        p.attn_norm = vec(l.attn_norm);
        // qk-norm (qwen3) works on whole q and k rows, so those models keep q/k/v apart.
        if (backend.packs_projections() && l.q_norm.empty()) {
            p.wqkv = backend.place_stacked({l.wq, l.wk, l.wv}, true);
            if (!l.bq.empty()) p.bqkv = backend.place_stacked({l.bq, l.bk, l.bv}, false);
        } else {
            p.wq = matrix(l.wq);
            p.wk = matrix(l.wk);
            p.wv = matrix(l.wv);
            p.bq = vec(l.bq);
            p.bk = vec(l.bk);
            p.bv = vec(l.bv);
        }
        p.q_norm = vec(l.q_norm);
        p.k_norm = vec(l.k_norm);
        p.wo = matrix(l.wo);
        p.ffn_norm = vec(l.ffn_norm);
        if (backend.packs_projections()) {
            p.w_gate_up = backend.place_stacked({l.w_gate, l.w_up}, true);
        } else {
            p.w_gate = matrix(l.w_gate);
            p.w_up = matrix(l.w_up);
        }
        p.w_down = matrix(l.w_down);
        out.layers.push_back(p);
    }
    return out;
}
}  // namespace

LlamaModel::LlamaModel(const LoadedModel& model, Backend& backend)
    : config_(model.config),
      weights_(place_weights(model.weights, backend)),
      backend_(backend),
      rope_(make_rope_table(model.config.rope)) {}

LlamaModel::~LlamaModel() {
    free_workspace();
}

KvCacheShape LlamaModel::kv_cache_shape(int num_blocks, int block_size) const {
    return {config_.num_layers,   num_blocks,       block_size,
            config_.num_kv_heads, config_.head_dim, backend_.kv_cache_dtype()};
}

void LlamaModel::free_workspace() {
    for (Tensor* t : {&ws_.residual, &ws_.hidden, &ws_.normed, &ws_.q, &ws_.attn, &ws_.k, &ws_.v, &ws_.gate, &ws_.up,
                      &ws_.selected, &ws_.logits})
        if (!t->empty()) backend_.release(*t);
    ws_.capacity = ws_.logit_rows = 0;
}

void LlamaModel::reserve(int64_t tokens, int64_t logit_rows) {
    if (tokens <= ws_.capacity && logit_rows <= ws_.logit_rows) return;
    tokens = std::max(tokens, ws_.capacity);
    logit_rows = std::max(logit_rows, ws_.logit_rows);
    backend_.forget_steps();  // recordings hold the old buffers' addresses
    free_workspace();
    const int64_t H = config_.hidden_size, F = config_.intermediate_size;
    const DType act = backend_.activation_dtype();
    ws_.residual = backend_.allocate(DType::F32, {tokens, H});
    ws_.hidden = backend_.allocate(DType::F32, {tokens, H});  // added to the f32 residual: kept f32
    ws_.normed = backend_.allocate(act, {tokens, H});
    ws_.q = backend_.allocate(act, {tokens, config_.q_dim()});
    ws_.attn = backend_.allocate(act, {tokens, config_.q_dim()});
    ws_.k = backend_.allocate(act, {tokens, config_.kv_dim()});
    ws_.v = backend_.allocate(act, {tokens, config_.kv_dim()});
    ws_.gate = backend_.allocate(act, {tokens, F});
    // With packed projections `up` holds gate | up [tokens, 2F] and `k` holds q | k | v.
    const bool packed = backend_.packs_projections();
    ws_.up = backend_.allocate(act, {tokens, packed ? 2 * F : F});
    if (packed) {
        backend_.release(ws_.k);
        ws_.k = backend_.allocate(act, {tokens, config_.q_dim() + 2 * config_.kv_dim()});
    }
    ws_.selected = backend_.allocate(act, {logit_rows, H});
    ws_.logits = backend_.allocate(DType::F32, {logit_rows, config_.vocab_size});
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
    PG_CHECK(cache.shape().num_layers == config_.num_layers && cache.shape().head_dim == config_.head_dim);

    // A decode-only step (one token per sequence, every one sampled in order) may be replayed
    // from a recording made for its padded size.
    const bool decode = n == batch.num_seqs() && batch.logits_of_every_token();
    const int bucket = decode ? backend_.step_bucket(batch.num_seqs()) : -1;
    const BatchInput* run = &batch;
    if (bucket > 0) {
        pad_decode_batch(batch, bucket, padded_);
        run = &padded_;
    }
    reserve(run->num_tokens(), std::max<int64_t>(static_cast<int64_t>(run->logits_indices.size()), 1));
    if (bucket > 0) {  // recordings write the cache they were made with
        cache_ptrs_.clear();
        for (int l = 0; l < config_.num_layers; ++l) {
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
    if (num_logits == 0) return Tensor();
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

    const int64_t H = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
    const Tensor residual = view(ws_.residual, n, H);  // the residual stream
    const Tensor hidden = view(ws_.hidden, n, H);      // an o / down product before its residual add
    const Tensor normed = view(ws_.normed, n, H);      // normalised input of the next block
    const Tensor q = view(ws_.q, n, c.q_dim());
    const Tensor attn = view(ws_.attn, n, c.q_dim());
    const Tensor k = view(ws_.k, n, c.kv_dim());
    const Tensor v = view(ws_.v, n, c.kv_dim());
    const Tensor gate = view(ws_.gate, n, F);
    const Tensor up = view(ws_.up, n, F);
    const Tensor none;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));

    backend_.embedding(weights_.embed, batch.token_ids.data(), n, residual);
    for (int l = 0; l < c.num_layers; ++l) {
        const LayerWeights& w = weights_.layers[l];
        // Attention block: pre-norm, then q, k, v.
        if (!w.wqkv.empty()) {
            const Tensor qkv = view(ws_.k, n, c.q_dim() + 2 * c.kv_dim());
            backend_.norm_matmul(residual, w.attn_norm, c.rms_norm_eps, w.wqkv, w.bqkv, qkv, normed);
            // RoPE, the cache write and attention: one step (one kernel for small decode batches).
            backend_.rope_cache_attention(qkv, q, batch, rope_, static_cast<int>(D), c.num_kv_heads, cache.k(l),
                                          cache.v(l), c.num_heads, scale, c.layer_window[l], attn);
        } else {
            backend_.rms_norm(residual, none, w.attn_norm, c.rms_norm_eps, normed);
            backend_.matmul(normed, w.wq, w.bq, q);
            backend_.matmul(normed, w.wk, w.bk, k);
            backend_.matmul(normed, w.wv, w.bv, v);
            if (c.qk_norm) {  // qwen3: RMSNorm over each head's vector before RoPE
                backend_.rms_norm(view(q, n * c.num_heads, D), none, w.q_norm, c.rms_norm_eps,
                                  view(q, n * c.num_heads, D));
                backend_.rms_norm(view(k, n * c.num_kv_heads, D), none, w.k_norm, c.rms_norm_eps,
                                  view(k, n * c.num_kv_heads, D));
            }
            backend_.rope_and_cache(q, k, v, batch, rope_, static_cast<int>(D), cache.k(l), cache.v(l));
            backend_.attention(q, cache.k(l), cache.v(l), batch, c.num_heads, static_cast<int>(D), scale,
                               c.layer_window[l], attn);
        }
        backend_.matmul_add(attn, w.wo, residual, hidden);
        // MLP block: pre-norm, SwiGLU, added to the residual.
        if (!w.w_gate_up.empty()) {
            backend_.norm_matmul_silu(residual, w.ffn_norm, c.rms_norm_eps, w.w_gate_up, gate, normed,
                                      view(ws_.up, n, 2 * F));
        } else {
            backend_.rms_norm(residual, none, w.ffn_norm, c.rms_norm_eps, normed);
            backend_.matmul(normed, w.w_gate, none, gate);
            backend_.matmul(normed, w.w_up, none, up);
            backend_.silu_mul(gate, up, gate);
        }
        backend_.matmul_add(gate, w.w_down, residual, hidden);
    }
    if (num_logits == 0) return Tensor();
    // Final norm and LM head, only for the rows whose logits are wanted.
    // (Not norm_matmul: folding the norm into the LM head's many CTAs cost more than the norm
    // kernel on an H100.)
    const Tensor out = view(ws_.logits, num_logits, c.vocab_size);
    backend_.rms_norm(residual, none, weights_.final_norm, c.rms_norm_eps, normed);
    const bool all_rows = batch.logits_of_every_token();
    const Tensor selected = all_rows ? normed : view(ws_.selected, num_logits, H);
    if (!all_rows) backend_.gather_rows(normed, batch.logits_indices, selected);
    backend_.matmul(selected, weights_.lm_head, none, out, /*exact=*/true);
    return out;
}

}  // namespace peregrine
