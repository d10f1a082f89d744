// The op interface the model's forward pass is written against. Ops are coarse (one call per
// layer stage) so that each backend chooses its own kernels, fusion and threading.
// Activations are f32 [rows, cols] unless noted; weights may be any dtype the backend reports
// in `supports_weight_dtype`.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/batch.h"
#include "model/rope.h"

namespace peregrine {

// A uniform value in [lo, hi] that depends only on (seed, index): dummy weights.
float uniform_hash(uint64_t seed, uint64_t index, float lo, float hi);

class Backend {
  public:
    virtual ~Backend() = default;

    virtual Device device() const = 0;
    virtual std::string name() const = 0;  // e.g. "cpu (avx512, 2 threads)"

    // Device memory, owned by the caller until `release`.
    virtual Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) = 0;
    virtual void release(Tensor& t) = 0;
    // Copies between host memory and a tensor of this backend (a plain memcpy on the CPU).
    virtual void upload(const void* src, const Tensor& dst) = 0;
    virtual void download(const Tensor& src, void* dst) = 0;

    // Whether `matmul` reads weights of this dtype directly (others are converted at load).
    virtual bool supports_weight_dtype(DType t) const = 0;

    // Element type of the activation buffers between ops (matmul inputs and outputs, q/k/v,
    // attention output). The residual stream, norm weights and logits are always f32.
    virtual DType activation_dtype() const { return DType::F32; }
    virtual DType kv_cache_dtype() const { return DType::F32; }

    // Places a loaded weight (host memory: a file mapping or a converted buffer) where this
    // backend's ops read it; the backend owns what it allocates here until it is destroyed.
    // `matrix`: a matmul or embedding weight (else a norm weight or bias, kept f32).
    virtual Tensor place_weight(const Tensor& host, bool matrix) {
        (void)matrix;
        return host;
    }
    // Whether the model should run q/k/v as one matmul and gate/up as another, over weights
    // stacked by place_stacked, with the *_packed ops below (fewer, larger launches on a GPU).
    virtual bool packs_projections() const { return false; }
    // One weight whose rows are the rows of `parts` in order (same columns), placed like
    // place_weight. Parts may already be this backend's (dummy weights).
    virtual Tensor place_stacked(const std::vector<Tensor>& parts, bool matrix);
    // Fills `t` (of this backend) with uniform values in [lo, hi], deterministic in `seed`:
    // the weights of `--load-format dummy`.
    virtual void fill_random(const Tensor& t, uint64_t seed, float lo, float hi);

    // Called once before a step's ops with the step's batch, which stays alive and unchanged
    // until the step's logits are downloaded (a GPU backend uploads its metadata here).
    virtual void begin_step(const BatchInput& batch) { (void)batch; }
    // The batch size a decode-only batch of `num_seqs` sequences is padded to so that a
    // recorded step can be replayed (CUDA graphs), or -1 when this backend records nothing.
    virtual int step_bucket(int num_seqs) const {
        (void)num_seqs;
        return -1;
    }
    // Runs `ops`, the ops of one step from the embedding to the logits. With key >= 0 a
    // backend may record them on first use and replay the recording for later steps of the
    // same key instead of calling `ops`; the ops must then read only device memory that
    // begin_step refreshes.
    virtual void run_step(int key, const std::function<void()>& ops) {
        (void)key;
        ops();
    }
    // Drops every recording made by run_step: the buffers they read or write (workspace, KV
    // cache) are about to change.
    virtual void forget_steps() {}

    // out[i] = table[ids[i]] (any weight dtype, converted to f32). out: [n, hidden].
    virtual void embedding(const Tensor& table, const int32_t* ids, int64_t n, const Tensor& out) = 0;

    // With `residual` non-empty: residual += x, then out = rms_norm(residual) * weight.
    // Otherwise out = rms_norm(x) * weight. x, residual, out: [rows, dim]; weight: [dim] f32.
    // `out` may alias `x`. Used per head (rows = tokens * heads, dim = head_dim) for qk-norm.
    virtual void rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                          const Tensor& out) = 0;

    // out = x · wᵀ (+ bias). x: [n, k] f32; w: [m, k]; bias: [m] f32 or empty; out: [n, m] f32.
    // `exact` keeps the inputs at full precision even in a reduced-precision mode: for the LM
    // head, whose near-ties decide greedy tokens and which runs for few rows.
    virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                        bool exact = false) = 0;

    // Rotates q [n, num_heads * head_dim] and k [n, num_kv_heads * head_dim] in place at
    // `positions`, then writes k and v [n, num_kv_heads * head_dim] into the cache slots of
    // `slot_mapping`. Caches: [num_blocks, block_size, num_kv_heads, head_dim].
    virtual void rope_and_cache(const Tensor& q, const Tensor& k, const Tensor& v, const BatchInput& batch,
                                const RopeTable& rope, int head_dim, const Tensor& k_cache, const Tensor& v_cache) = 0;

    // Causal attention of every batch token over its sequence's cached keys/values (which
    // already include this step's). q, out: [n, num_heads * head_dim]. window > 0 limits a
    // query at position p to keys in (p - window, p]. GQA: query head h reads kv head
    // h / (num_heads / num_kv_heads).
    virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const BatchInput& batch,
                           int num_heads, int head_dim, float scale, int window, const Tensor& out) = 0;

    // out = silu(gate) * up; all [n, dim]. `out` may alias `gate`.
    virtual void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;

    // The packed forms (packs_projections): qkv [n, q_dim + 2 kv_dim] holds q | k | v per row;
    // rotates like rope_and_cache, writes the rotated q to q_out [n, q_dim] and k, v to the cache.
    virtual void rope_and_cache_packed(const Tensor& qkv, const Tensor& q_out, const BatchInput& batch,
                                       const RopeTable& rope, int head_dim, int num_kv_heads, const Tensor& k_cache,
                                       const Tensor& v_cache);
    // gate_up [n, 2 dim] holds gate | up per row; out [n, dim] = silu(gate) * up.
    virtual void silu_mul_packed(const Tensor& gate_up, const Tensor& out);
    // Fused step (a backend may do it in one kernel; the default is the two ops):
    // rope_and_cache_packed(qkv, q, ...) then attention(q, ...) into out [n, num_heads * head_dim].
    // `q` [n, num_heads * head_dim] holds the rotated q where the steps run apart; a fused form
    // may leave it unwritten (attention is its only reader).
    virtual void rope_cache_attention(const Tensor& qkv, const Tensor& q, const BatchInput& batch,
                                      const RopeTable& rope, int head_dim, int num_kv_heads, const Tensor& k_cache,
                                      const Tensor& v_cache, int num_heads, float scale, int window, const Tensor& out);

    // Fused step (a backend may do it in one kernel; the default is the two ops):
    // out [n, dim] = silu(x · gateᵀ) * (x · upᵀ) for w_gate_up [2 dim, k] (packs_projections);
    // scratch [n, 2 dim] holds the product where the steps run apart.
    virtual void matmul_silu(const Tensor& x, const Tensor& w_gate_up, const Tensor& out, const Tensor& scratch);

    // The pre-norms and residual adds around the products, as fused steps (a backend may fold
    // them into its product kernels; the defaults run the plain ops):
    // out = (rms_norm(x) * norm_weight) · wᵀ (+ bias) for x [n, k] f32 (the residual stream);
    // `normed` [n, k] (activation dtype) holds the normalised rows where the steps run apart.
    virtual void norm_matmul(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w,
                             const Tensor& bias, const Tensor& out, const Tensor& normed);
    // The same before matmul_silu: out [n, dim] = silu(h · gateᵀ) * (h · upᵀ), h = rms_norm(x) * norm_weight.
    virtual void norm_matmul_silu(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w_gate_up,
                                  const Tensor& out, const Tensor& normed, const Tensor& scratch);
    // residual [n, m] f32 += x · wᵀ; `scratch` [n, m] f32 holds the product where the steps run apart.
    virtual void matmul_add(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& scratch);
    // out += x, both f32 of one shape.
    virtual void add(const Tensor& x, const Tensor& out) = 0;

    // Copies whole KV blocks (copy-on-write): cache[dst] = cache[src] for each pair.
    // cache: [num_blocks, block_size, num_kv_heads, head_dim].
    virtual void copy_blocks(const Tensor& cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) = 0;

    // out[i] = x[rows[i]]; x: [n, dim], out: [rows.size(), dim].
    virtual void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& out) = 0;
};

}  // namespace peregrine
