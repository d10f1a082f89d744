// `--load-format dummy`: a model's shape from its config, with random weights.
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "model/loader.h"

namespace peregrine {

std::unique_ptr<LoadedModel> load_dummy_model(const std::string& path, Backend& backend, uint64_t seed, float scale,
                                              TensorParallel tp, PipelineStage pp) {
    std::unique_ptr<LoadedModel> m = open_model_config(path);
    m->format = "dummy (" + std::string(m->gguf ? "gguf metadata" : "config.json") + ")";
    m->config = shard_config(m->config, tp, m->path);
    // The rank's shapes: heads, kv heads and intermediate size are the shard's; the embedding
    // and LM head hold the rank's vocabulary rows.
    const ModelConfig& c = m->config;
    const int64_t vocab_rows = c.vocab_rows();
    const DType mat = backend.activation_dtype();

    // Every tensor allocated here is released when the LoadedModel goes.
    auto owned = std::make_shared<std::vector<Tensor>>();
    Backend* b = &backend;
    m->backend_memory = std::shared_ptr<void>(owned.get(), [owned, b](void*) {
        for (Tensor& t : *owned) b->release(t);
    });
    // One seed per tensor, in the same order on every rank, so the replicated norms agree
    // across ranks; a sharded tensor's seed is moved by the rank so ranks hold different values
    // (rank 0, and every tensor with tensor parallel size 1, keeps the one-rank seed).
    uint64_t next = seed * 1000003u + 1;
    const uint64_t rank_offset = static_cast<uint64_t>(tp.rank) * 0x9E3779B97F4A7C15ull;
    auto make = [&](DType t, std::initializer_list<int64_t> shape, float lo, float hi, bool sharded) {
        Tensor x = backend.allocate(t, shape);
        owned->push_back(x);
        backend.fill_random(x, next++ + (sharded ? rank_offset : 0), lo, hi);
        return x;
    };
    auto matrix = [&](int64_t rows, int64_t cols) { return make(mat, {rows, cols}, -scale, scale, true); };
    auto norm = [&](int64_t n) { return make(DType::F32, {n}, 0.9f, 1.1f, false); };
    auto bias = [&](int64_t n) { return make(DType::F32, {n}, -scale, scale, true); };

    const int64_t H = c.hidden_size, F = c.intermediate_size;
    ModelWeights& w = m->weights;
    w.embed = matrix(vocab_rows, H);
    const StageLayers mine = stage_layers(c.num_layers, pp.stage, pp.stages);
    const uint64_t per_layer = 9 + (c.attention_bias ? 3 : 0) + (c.qk_norm ? 2 : 0);  // tensors made below
    for (int l = 0; l < c.num_layers; ++l) {
        if (!mine.contains(l)) {  // another stage's: its seeds are skipped, not drawn
            w.layers.emplace_back();
            next += per_layer;
            continue;
        }
        LayerWeights lw;
        lw.attn_norm = norm(H);
        lw.wq = matrix(c.q_dim(), H);
        lw.wk = matrix(c.kv_dim(), H);
        lw.wv = matrix(c.kv_dim(), H);
        if (c.attention_bias) {
            lw.bq = bias(c.q_dim());
            lw.bk = bias(c.kv_dim());
            lw.bv = bias(c.kv_dim());
        }
        if (c.qk_norm) {
            lw.q_norm = norm(c.head_dim);
            lw.k_norm = norm(c.head_dim);
        }
        lw.wo = matrix(H, c.q_dim());
        lw.ffn_norm = norm(H);
        lw.w_gate = matrix(F, H);
        lw.w_up = matrix(F, H);
        lw.w_down = matrix(H, F);
        w.layers.push_back(lw);
    }
    w.final_norm = norm(H);
    w.lm_head = c.tie_word_embeddings ? w.embed : matrix(vocab_rows, H);
    m->weight_dtypes = std::string(dtype_name(mat)) + " (random)";
    return m;
}

}  // namespace peregrine
