// `--load-format dummy`: a model's shape from its config, with random weights.
#include <algorithm>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "model/loader.h"

namespace peregrine {

namespace {

// The tensors of a layer, for release and alias checks.
std::vector<const Tensor*> layer_tensors(const LayerWeights& l) {
    return {&l.attn_norm, &l.wq,       &l.wk,     &l.wv,   &l.bq,     &l.bk,   &l.bv,   &l.q_norm,   &l.k_norm,
            &l.wo,        &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down, &l.wqkv, &l.bqkv, &l.w_gate_up};
}

}  // namespace

std::unique_ptr<LoadedModel> load_dummy_model(const std::string& path, Backend& backend, uint64_t seed, float scale,
                                              TensorParallel tp, PipelineStage pp, bool lazy_layers) {
    std::unique_ptr<LoadedModel> m = open_model_config(path);
    m->format = "dummy (" + std::string(m->gguf ? "gguf metadata" : "config.json") + ")";
    m->config = shard_config(m->config, tp, m->path);
    // The rank's shapes: heads, kv heads and intermediate size are the shard's; the embedding
    // and LM head hold the rank's vocabulary rows.
    const ModelConfig& c = m->config;  // make_layer keeps a copy
    const int64_t vocab_rows = c.vocab_rows();
    const DType mat = backend.activation_dtype();

    // Every tensor kept here is released when the LoadedModel goes.
    auto owned = std::make_shared<std::vector<Tensor>>();
    Backend* b = &backend;
    m->backend_memory = std::shared_ptr<void>(owned.get(), [owned, b](void*) {
        for (Tensor& t : *owned) b->release(t);
    });
    // One seed per tensor, in the same order on every rank, so the replicated norms agree across
    // ranks; a sharded tensor's seed is moved by the rank so ranks hold different values (rank 0,
    // and every tensor with tensor parallel size 1, keeps the one-rank seed). Seeds: the
    // embedding's first, then per_layer a layer (a stage's own layers only are drawn, the others'
    // seeds skipped), the final norm's, the LM head's.
    const uint64_t first = seed * 1000003u + 1;
    const uint64_t rank_offset = static_cast<uint64_t>(tp.rank) * 0x9E3779B97F4A7C15ull;
    const uint64_t per_layer = 9 + (c.attention_bias ? 3 : 0) + (c.qk_norm ? 2 : 0);  // tensors of make_layer
    // A tensor of this shape drawn from seed `next`, kept (owned) or handed to the caller.
    auto make = [b, owned, rank_offset](uint64_t& next, DType t, std::initializer_list<int64_t> shape, float lo,
                                        float hi, bool sharded, bool keep) {
        Tensor x = b->allocate(t, shape);
        if (keep) owned->push_back(x);
        b->fill_random(x, next++ + (sharded ? rank_offset : 0), lo, hi);
        return x;
    };
    const int64_t H = c.hidden_size, F = c.intermediate_size;
    // Layer l's tensors, drawn from its seeds; keep: owned here (else the caller's, layer_placed).
    auto make_layer = [make, c, H, F, mat, scale, first, per_layer](int l, bool keep) {
        uint64_t next = first + 1 + static_cast<uint64_t>(l) * per_layer;
        auto matrix = [&](int64_t rows, int64_t cols) {
            return make(next, mat, {rows, cols}, -scale, scale, true, keep);
        };
        auto norm = [&](int64_t n) { return make(next, DType::F32, {n}, 0.9f, 1.1f, false, keep); };
        auto bias = [&](int64_t n) { return make(next, DType::F32, {n}, -scale, scale, true, keep); };
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
        return lw;
    };

    ModelWeights& w = m->weights;
    uint64_t next = first;
    w.embed = make(next, mat, {vocab_rows, H}, -scale, scale, true, true);
    const StageLayers mine = stage_layers(c.num_layers, pp.stage, pp.stages);
    for (int l = 0; l < c.num_layers; ++l)
        w.layers.push_back(mine.contains(l) && !lazy_layers ? make_layer(l, true) : LayerWeights());
    next = first + 1 + static_cast<uint64_t>(c.num_layers) * per_layer;
    w.final_norm = make(next, DType::F32, {H}, 0.9f, 1.1f, false, true);
    w.lm_head = c.tie_word_embeddings ? w.embed : make(next, mat, {vocab_rows, H}, -scale, scale, true, true);
    if (lazy_layers) {
        m->make_layer = [make_layer, mine](int l) {
            if (!mine.contains(l)) fail("dummy load: layer ", l, " is not among this stage's layers");
            return make_layer(l, false);
        };
        // What the placed layer points into (a backend that keeps a tensor as it is) stays until
        // the model goes; the rest (copied into a stacked product, quantized) goes now.
        m->layer_placed = [b, owned](const LayerWeights& made, const LayerWeights& placed) {
            const std::vector<const Tensor*> kept = layer_tensors(placed);
            for (const Tensor* t : layer_tensors(made)) {
                if (t->empty()) continue;
                const bool aliased =
                    std::any_of(kept.begin(), kept.end(), [t](const Tensor* p) { return p->data == t->data; });
                Tensor x = *t;
                if (aliased)
                    owned->push_back(x);
                else
                    b->release(x);
            }
        };
    }
    m->weight_dtypes = std::string(dtype_name(mat)) + " (random)";
    return m;
}

}  // namespace peregrine
