// The CPU backend: f32 activations, weights read in their stored dtype (f32, bf16, f16; the
// block-quantized q8_0, q4_0, q4_k, q6_k through 8-bit activations), one thread pool shared
// by all ops.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/scratch.h"

namespace peregrine {

class ThreadPool;

// How matmul inputs are rounded. Float32 is the reference mode; BFloat16 rounds activations
// to bf16 for matmuls with bf16 weights, which AVX512-BF16 multiplies at twice the f32 rate
// (accumulating in f32). Everything else stays f32 in both modes.
enum class CpuPrecision { Float32, BFloat16 };

// What `--dtype auto|float32|bfloat16` means on this CPU (auto is float32 for now); throws
// Error for bfloat16 on a CPU without AVX512-BF16 and for unknown names.
CpuPrecision cpu_precision_from_name(const std::string& name);
const char* cpu_precision_name(CpuPrecision p);

class CpuBackend final : public Backend {
  public:
    // num_threads <= 0: one per core. Throws Error if the CPU lacks AVX2.
    explicit CpuBackend(int num_threads = 0, CpuPrecision precision = CpuPrecision::Float32);
    CpuPrecision precision() const { return precision_; }
    ~CpuBackend() override;

    Device device() const override { return Device::CPU; }
    std::string name() const override;
    int num_threads() const;

    Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) override;
    void release(Tensor& t) override;
    void upload(const void* src, const Tensor& dst) override;
    void download(const Tensor& src, void* dst) override;
    void copy_blocks(const Tensor& cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t rows,
                      int64_t cols) override;
    // Sizes the blocks' scratch (scratch.h) for the step.
    void begin_step(const BatchInput& batch) override;
    bool supports_weight_dtype(DType t) const override;

    // The blocks, each the plain ops below in the order of unfused_blocks.h.
    void embedding(const Tensor& table, const int32_t* ids, int64_t n, const Tensor& out, int32_t vocab_begin) override;
    void attention_block(const Tensor& residual, const LayerWeights& w, const AttentionParams& p,
                         const BatchInput& batch, const Tensor& k_cache, const Tensor& v_cache) override;
    void mlp_block(const Tensor& residual, const LayerWeights& w, float norm_eps, Communicator* tp) override;
    void logits(const Tensor& residual, const Tensor& final_norm, float norm_eps, const Tensor& lm_head,
                const BatchInput& batch, const Tensor& out) override;

    // ---- plain ops (f32 CPU tensors [rows, cols]) -----------------------------------------------
    // Not part of Backend (the blocks run them): public as the reference other kernels are
    // tested against (tests/cuda, the sliding-window test).

    // With `residual` non-empty: residual += x, then out = rms_norm(residual) * weight.
    // Otherwise out = rms_norm(x) * weight. x, residual, out: [rows, dim]; weight: [dim].
    // `out` may alias `x`. Used per head (rows = tokens * heads, dim = head_dim) for qk-norm.
    void rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps, const Tensor& out);
    // out = x · wᵀ (+ bias). x: [n, k]; w: [m, k] of any supported dtype; bias: [m] or empty;
    // out: [n, m]. `exact` keeps the inputs at f32 in bf16 precision mode (the LM head).
    void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, bool exact = false);
    // residual [n, m] += x · wᵀ, through `product` [n, m] (matmul, then add).
    void matmul_add(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& product);
    // Rotates q [n, num_heads * head_dim] and k [n, num_kv_heads * head_dim] in place at
    // `positions`, then writes k and v [n, num_kv_heads * head_dim] into the cache slots of
    // `slot_mapping`.
    void rope_and_cache(const Tensor& q, const Tensor& k, const Tensor& v, const BatchInput& batch,
                        const RopeTable& rope, int head_dim, const Tensor& k_cache, const Tensor& v_cache);
    // Causal attention of every batch token over its sequence's cached keys/values (which
    // already include this step's). q, out: [n, num_heads * head_dim]. window > 0 limits a
    // query at position p to keys in (p - window, p].
    void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const BatchInput& batch,
                   int num_heads, int head_dim, float scale, int window, const Tensor& out);
    // out = silu(gate) * up; all [n, dim]. `out` may alias `gate`.
    void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
    // out += x, both of one shape.
    void add(const Tensor& x, const Tensor& out);
    // out[i] = x[rows[i]]; x: [n, dim], out: [rows.size(), dim].
    void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& out);

  private:
    std::unique_ptr<ThreadPool> pool_;
    const cpu::Kernels* kernels_;
    CpuPrecision precision_;
    std::vector<uint16_t> x_bf16_;  // [n, k] scratch: matmul input rounded to bf16
    std::vector<uint8_t> x_q8_;     // [n] rows of act_row_bytes(k): matmul input as 8-bit blocks
    std::vector<int32_t> seq_of_;   // [n] attention: the sequence of each batch token
    Scratch scratch_{*this};        // the blocks' buffers (scratch.h)
};

}  // namespace peregrine
