// The blocks of backend.h as sequences of plain ops, for a backend that runs them apart: the
// CPU for every block; CUDA for the attention of qk-norm models (qwen3 normalises whole q and
// k heads, so their projections stay apart) and for the final norm and LM head.
//
// `Ops` is a backend class with these members, as CpuBackend and CudaBackend declare them:
//   rms_norm(x, residual, weight, eps, out)        out = rms_norm(x) * weight, per row
//   matmul(x, w, bias, out, exact)                 out = x · wᵀ (+ bias)
//   matmul_add(x, w, residual, product)            residual += x · wᵀ (product: f32 scratch)
//   add(x, out)                                    out += x (f32)
//   rope_and_cache(q, k, v, batch, rope, head_dim, k_cache, v_cache)
//   attention(q, k_cache, v_cache, batch, num_heads, head_dim, scale, window, out)
//   silu_mul(gate, up, out)                        out = silu(gate) * up
//   gather_rows(x, rows, out)                      out[i] = x[rows[i]]
// and activation_dtype(). Scratch shapes are those of scratch.h.
#pragma once

#include "backend/backend.h"
#include "backend/scratch.h"

namespace peregrine {

namespace unfused {

// residual += x · wᵀ; under tensor parallelism (tp of several ranks) x · wᵀ is this rank's
// partial sum: computed into `product` [n, m] f32, all-reduced, then added.
template <class Ops>
void add_product(Ops& ops, const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& product,
                 Communicator* tp) {
    if (tp == nullptr || tp->size() == 1) {
        ops.matmul_add(x, w, residual, product);
        return;
    }
    ops.matmul(x, w, Tensor(), product, false);
    tp->all_reduce_sum(product.data, static_cast<size_t>(product.numel()), DType::F32);
    ops.add(product, residual);
}

// A [rows, cols] view of the same memory.
inline Tensor reshaped(const Tensor& t, int64_t rows, int64_t cols) {
    return Tensor(t.data, t.dtype, {rows, cols}, t.device);
}

template <class Ops>
void attention_block(Ops& ops, Scratch& scratch, const Tensor& residual, const LayerWeights& w,
                     const AttentionParams& p, const BatchInput& batch, const Tensor& k_cache, const Tensor& v_cache) {
    const int64_t n = residual.rows(), H = residual.cols(), D = p.head_dim;
    const int64_t q_dim = p.num_heads * D, kv_dim = p.num_kv_heads * D;
    const DType act = ops.activation_dtype();
    const Tensor normed = scratch.get(ScratchSlot::Normed, act, n, H);
    const Tensor q = scratch.get(ScratchSlot::Q, act, n, q_dim);
    const Tensor k = scratch.get(ScratchSlot::K, act, n, kv_dim);
    const Tensor v = scratch.get(ScratchSlot::V, act, n, kv_dim);
    const Tensor attn = scratch.get(ScratchSlot::Attn, act, n, q_dim);
    const Tensor product = scratch.get(ScratchSlot::Product, DType::F32, n, H);
    const Tensor none;

    ops.rms_norm(residual, none, w.attn_norm, p.norm_eps, normed);
    ops.matmul(normed, w.wq, w.bq, q, false);
    ops.matmul(normed, w.wk, w.bk, k, false);
    ops.matmul(normed, w.wv, w.bv, v, false);
    if (!w.q_norm.empty()) {  // qk-norm: RMSNorm over each head's vector before RoPE
        const Tensor q_heads = reshaped(q, n * p.num_heads, D), k_heads = reshaped(k, n * p.num_kv_heads, D);
        ops.rms_norm(q_heads, none, w.q_norm, p.norm_eps, q_heads);
        ops.rms_norm(k_heads, none, w.k_norm, p.norm_eps, k_heads);
    }
    ops.rope_and_cache(q, k, v, batch, *p.rope, p.head_dim, k_cache, v_cache);
    ops.attention(q, k_cache, v_cache, batch, p.num_heads, p.head_dim, p.scale, p.window, attn);
    add_product(ops, attn, w.wo, residual, product, p.tp);
}

template <class Ops>
void mlp_block(Ops& ops, Scratch& scratch, const Tensor& residual, const LayerWeights& w, float norm_eps,
               Communicator* tp) {
    const int64_t n = residual.rows(), H = residual.cols(), F = w.w_gate.rows();
    const DType act = ops.activation_dtype();
    const Tensor normed = scratch.get(ScratchSlot::Normed, act, n, H);
    const Tensor gate = scratch.get(ScratchSlot::Gate, act, n, F);
    const Tensor up = scratch.get(ScratchSlot::Up, act, n, F);
    const Tensor product = scratch.get(ScratchSlot::Product, DType::F32, n, H);
    const Tensor none;

    ops.rms_norm(residual, none, w.ffn_norm, norm_eps, normed);
    ops.matmul(normed, w.w_gate, none, gate, false);
    ops.matmul(normed, w.w_up, none, up, false);
    ops.silu_mul(gate, up, gate);
    add_product(ops, gate, w.w_down, residual, product, tp);
}

template <class Ops>
void logits(Ops& ops, Scratch& scratch, const Tensor& residual, const Tensor& final_norm, float norm_eps,
            const Tensor& lm_head, const BatchInput& batch, const Tensor& out) {
    const int64_t n = residual.rows(), H = residual.cols();
    const int64_t num_logits = static_cast<int64_t>(batch.logits_indices.size());
    const DType act = ops.activation_dtype();
    const Tensor normed = scratch.get(ScratchSlot::Normed, act, n, H);

    ops.rms_norm(residual, Tensor(), final_norm, norm_eps, normed);
    const bool all_rows = batch.logits_of_every_token();
    const Tensor selected = all_rows ? normed : scratch.get(ScratchSlot::Selected, act, num_logits, H);
    if (!all_rows) ops.gather_rows(normed, batch.logits_indices, selected);
    ops.matmul(selected, lm_head, Tensor(), out, /*exact=*/true);
}

}  // namespace unfused

}  // namespace peregrine
