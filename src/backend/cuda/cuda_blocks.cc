// The CUDA backend's weight layout and blocks: q/k/v and gate/up stacked into one product each,
// pre-norms and residual adds folded into the products (the decode kernels fuse them), RoPE,
// the cache write and attention in one step. Scratch buffers: backend/scratch.h.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/peer_communicator.h"
#include "backend/unfused_blocks.h"

namespace peregrine {

LayerWeights CudaBackend::place_layer(const LayerWeights& l) {
    auto vec = [&](const Tensor& t) { return t.empty() ? t : place_weight(t, false); };
    LayerWeights p;
    p.attn_norm = vec(l.attn_norm);
    // qk-norm (qwen3) works on whole q and k heads between the projection and RoPE, so those
    // layers keep q/k/v apart.
    // GGUF q, k and v of different device layouts (Q4_K_M's Q6_K v) stay apart, each quantized.
    const bool mixed_qkv = !keeps_gguf({l.wq, l.wk, l.wv}) && (keeps_gguf({l.wq}) || keeps_gguf({l.wv}));
    if (l.q_norm.empty() && !mixed_qkv) {
        p.wqkv = place_layer_matrix({l.wq, l.wk, l.wv});
        if (!l.bq.empty()) p.bqkv = place_stacked({l.bq, l.bk, l.bv}, false);
    } else {
        p.wq = place_layer_matrix({l.wq});
        p.wk = place_layer_matrix({l.wk});
        p.wv = place_layer_matrix({l.wv});
        p.bq = vec(l.bq);
        p.bk = vec(l.bk);
        p.bv = vec(l.bv);
    }
    p.q_norm = vec(l.q_norm);
    p.k_norm = vec(l.k_norm);
    p.wo = place_layer_matrix({l.wo});
    p.ffn_norm = vec(l.ffn_norm);
    p.w_gate_up = place_layer_matrix({l.w_gate, l.w_up});
    p.w_down = place_layer_matrix({l.w_down});
    if (options_.fp8_weights)
        for (Tensor* t : {&p.wqkv, &p.wq, &p.wk, &p.wv, &p.wo, &p.w_gate_up, &p.w_down}) *t = quantize_weight(*t);
    return p;
}

void CudaBackend::attention_block(const Tensor& residual, const LayerWeights& w, const AttentionParams& p,
                                  const BatchInput& batch, const Tensor& k_cache, const Tensor& v_cache) {
    if (w.wqkv.empty()) {  // qk-norm: q, k and v apart
        unfused::attention_block(*this, scratch_, residual, w, p, batch, k_cache, v_cache);
        return;
    }
    const int64_t n = residual.rows(), H = residual.cols();
    const int64_t q_dim = static_cast<int64_t>(p.num_heads) * p.head_dim;
    const int64_t kv_dim = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
    const Tensor normed = scratch_.get(ScratchSlot::Normed, DType::BF16, n, H);
    const Tensor qkv = scratch_.get(ScratchSlot::Qkv, DType::BF16, n, q_dim + 2 * kv_dim);
    const Tensor q = scratch_.get(ScratchSlot::Q, DType::BF16, n, q_dim);
    const Tensor attn = scratch_.get(ScratchSlot::Attn, DType::BF16, n, q_dim);
    const Tensor product = scratch_.get(ScratchSlot::Product, DType::F32, n, H);

    norm_matmul(residual, w.attn_norm, p.norm_eps, w.wqkv, w.bqkv, qkv, normed);
    // RoPE, the cache write and attention: one step (one kernel for small decode batches).
    rope_cache_attention(qkv, q, batch, *p.rope, p.head_dim, p.num_kv_heads, k_cache, v_cache, p.num_heads, p.scale,
                         p.window, attn);
    add_product(attn, w.wo, residual, product, p.tp);
}

void CudaBackend::mlp_block(const Tensor& residual, const LayerWeights& w, float norm_eps, Communicator* tp) {
    PG_CHECK(!w.w_gate_up.empty(), "CUDA backend: mlp_block of a layer not placed by place_layer");
    const int64_t n = residual.rows(), H = residual.cols(), F = w.w_gate_up.rows() / 2;
    const Tensor normed = scratch_.get(ScratchSlot::Normed, DType::BF16, n, H);
    const Tensor gate = scratch_.get(ScratchSlot::Gate, DType::BF16, n, F);
    const Tensor gate_up = scratch_.get(ScratchSlot::GateUp, DType::BF16, n, 2 * F);
    const Tensor product = scratch_.get(ScratchSlot::Product, DType::F32, n, H);

    // FP8 prefill: the down product's input quantized by the silu itself.
    if (!use_gemv_norm(residual, w.ffn_norm, w.w_gate_up) && w.w_down.dtype == DType::F8_E4M3) {
        norm_matmul(residual, w.ffn_norm, norm_eps, w.w_gate_up, Tensor(), gate_up, normed);
        const Tensor g8 = silu_e4m3(gate_up, w.w_down);
        if (g8.empty()) silu_mul_packed(gate_up, gate);
        add_product(g8.empty() ? gate : g8, w.w_down, residual, product, tp);
        return;
    }
    norm_matmul_silu(residual, w.ffn_norm, norm_eps, w.w_gate_up, gate, normed, gate_up);
    add_product(gate, w.w_down, residual, product, tp);
}

void CudaBackend::add_product(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& product,
                              Communicator* tp) {
    auto* peer = dynamic_cast<PeerCommunicator*>(tp);
    const size_t count = static_cast<size_t>(product.numel());
    if (peer && peer->fits(count)) {
        matmul(x, w, Tensor(), product, false);
        peer->reduce_add(static_cast<const float*>(product.data), static_cast<float*>(residual.data), count);
        return;
    }
    unfused::add_product(*this, x, w, residual, product, tp);
}

void CudaBackend::logits(const Tensor& residual, const Tensor& final_norm, float norm_eps, const Tensor& lm_head,
                         const BatchInput& batch, const Tensor& out) {
    unfused::logits(*this, scratch_, residual, final_norm, norm_eps, lm_head, batch, out);
}

}  // namespace peregrine
