#include "model/llama.h"

#include <cmath>

#include "core/error.h"

namespace peregrine {

namespace {
// A [rows, cols] f32 view of the first rows of a workspace buffer.
Tensor view(const Tensor& buf, int64_t rows, int64_t cols) {
    return Tensor(buf.data, DType::F32, {rows, cols}, buf.device);
}
}  // namespace

LlamaModel::LlamaModel(const LoadedModel& model, Backend& backend)
    : config_(model.config), weights_(model.weights), backend_(backend), rope_(make_rope_table(model.config.rope)) {}

LlamaModel::~LlamaModel() {
    free_workspace();
}

KvCacheShape LlamaModel::kv_cache_shape(int num_blocks, int block_size) const {
    return {config_.num_layers, num_blocks, block_size, config_.num_kv_heads, config_.head_dim};
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
    free_workspace();
    const int64_t H = config_.hidden_size, F = config_.intermediate_size;
    ws_.residual = backend_.allocate(DType::F32, {tokens, H});
    ws_.hidden = backend_.allocate(DType::F32, {tokens, H});
    ws_.normed = backend_.allocate(DType::F32, {tokens, H});
    ws_.q = backend_.allocate(DType::F32, {tokens, config_.q_dim()});
    ws_.attn = backend_.allocate(DType::F32, {tokens, config_.q_dim()});
    ws_.k = backend_.allocate(DType::F32, {tokens, config_.kv_dim()});
    ws_.v = backend_.allocate(DType::F32, {tokens, config_.kv_dim()});
    ws_.gate = backend_.allocate(DType::F32, {tokens, F});
    ws_.up = backend_.allocate(DType::F32, {tokens, F});
    ws_.selected = backend_.allocate(DType::F32, {logit_rows, H});
    ws_.logits = backend_.allocate(DType::F32, {logit_rows, config_.vocab_size});
    ws_.capacity = tokens;
    ws_.logit_rows = logit_rows;
}

void LlamaModel::forward(const BatchInput& batch, KvCache& cache, std::vector<float>& logits) {
    const ModelConfig& c = config_;
    const int64_t n = batch.num_tokens();
    const int64_t num_logits = static_cast<int64_t>(batch.logits_indices.size());
    PG_CHECK(n > 0 && static_cast<int64_t>(batch.positions.size()) == n &&
             static_cast<int64_t>(batch.slot_mapping.size()) == n);
    PG_CHECK(cache.shape().num_layers == c.num_layers && cache.shape().head_dim == c.head_dim);
    reserve(n, std::max<int64_t>(num_logits, 1));

    const int64_t H = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
    const Tensor residual = view(ws_.residual, n, H);  // the residual stream
    const Tensor hidden = view(ws_.hidden, n, H);      // output of the last attention / MLP block
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
        // Attention block: pre-norm (adding the previous MLP output to the residual first).
        backend_.rms_norm(l == 0 ? residual : hidden, l == 0 ? none : residual, w.attn_norm, c.rms_norm_eps, normed);
        backend_.matmul(normed, w.wq, w.bq, q);
        backend_.matmul(normed, w.wk, w.bk, k);
        backend_.matmul(normed, w.wv, w.bv, v);
        if (c.qk_norm) {  // qwen3: RMSNorm over each head's vector before RoPE
            backend_.rms_norm(view(q, n * c.num_heads, D), none, w.q_norm, c.rms_norm_eps, view(q, n * c.num_heads, D));
            backend_.rms_norm(view(k, n * c.num_kv_heads, D), none, w.k_norm, c.rms_norm_eps,
                              view(k, n * c.num_kv_heads, D));
        }
        backend_.rope_and_cache(q, k, v, batch, rope_, static_cast<int>(D), cache.k(l), cache.v(l));
        backend_.attention(q, cache.k(l), cache.v(l), batch, c.num_heads, static_cast<int>(D), scale, c.layer_window[l],
                           attn);
        backend_.matmul(attn, w.wo, none, hidden);
        // MLP block: SwiGLU.
        backend_.rms_norm(hidden, residual, w.ffn_norm, c.rms_norm_eps, normed);
        backend_.matmul(normed, w.w_gate, none, gate);
        backend_.matmul(normed, w.w_up, none, up);
        backend_.silu_mul(gate, up, gate);
        backend_.matmul(gate, w.w_down, none, hidden);
    }
    if (num_logits == 0) {
        logits.clear();
        return;
    }
    // Final norm and LM head, only for the rows whose logits are wanted.
    backend_.rms_norm(hidden, residual, weights_.final_norm, c.rms_norm_eps, normed);
    const Tensor selected = view(ws_.selected, num_logits, H);
    backend_.gather_rows(normed, batch.logits_indices, selected);
    const Tensor out = view(ws_.logits, num_logits, c.vocab_size);
    backend_.matmul(selected, weights_.lm_head, none, out, /*exact=*/true);
    logits.resize(static_cast<size_t>(num_logits) * c.vocab_size);
    backend_.download(out, logits.data());
}

}  // namespace peregrine
