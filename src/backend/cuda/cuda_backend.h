// The CUDA backend: bf16 weights and activations on one GPU, f32 residual stream and logits,
// bf16 paged KV cache; GEMMs through cuBLASLt, everything else through our kernels
// (cuda_kernels.h); decode steps recorded once per padded batch size as CUDA graphs.
// All work is enqueued on one stream; only download() and copies back wait for it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"

typedef struct CUevent_st* cudaEvent_t;  // as cuda_runtime.h has it

namespace peregrine {

struct CudaOptions {
    int device = 0;
    bool graphs = true;         // false: --enforce-eager
    int max_graph_batch = 256;  // decode batches above this run eagerly
    bool gemv = true;           // our skinny-product kernel for n <= 4 (else cuBLASLt for all)
    // Batch-invariant mode (--batch-invariant): every product through gemm_invariant and the
    // attention's invariant path, so a token's results never depend on the rest of the batch.
    bool batch_invariant = false;
};

// Whether a CUDA device is present (never throws).
bool cuda_device_available();

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(const CudaOptions& options = {});
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    Device device() const override { return Device::CUDA; }
    std::string name() const override;

    Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) override;
    void release(Tensor& t) override;
    void upload(const void* src, const Tensor& dst) override;
    void download(const Tensor& src, void* dst) override;
    bool supports_weight_dtype(DType t) const override;
    DType activation_dtype() const override { return DType::BF16; }
    DType kv_cache_dtype() const override { return DType::BF16; }
    Tensor place_weight(const Tensor& host, bool matrix) override;
    bool packs_projections() const override { return true; }
    Tensor place_stacked(const std::vector<Tensor>& parts, bool matrix) override;
    void rope_and_cache_packed(const Tensor& qkv, const Tensor& q_out, const BatchInput& batch, const RopeTable& rope,
                               int head_dim, int num_kv_heads, const Tensor& k_cache, const Tensor& v_cache) override;
    void silu_mul_packed(const Tensor& gate_up, const Tensor& out) override;
    // One kernel (cuda::rope_cache_attention) for pure-decode batches of <= 4 sequences outside
    // batch-invariant mode; otherwise the two ops.
    void rope_cache_attention(const Tensor& qkv, const Tensor& q, const BatchInput& batch, const RopeTable& rope,
                              int head_dim, int num_kv_heads, const Tensor& k_cache, const Tensor& v_cache,
                              int num_heads, float scale, int window, const Tensor& out) override;
    void matmul_silu(const Tensor& x, const Tensor& w_gate_up, const Tensor& out, const Tensor& scratch) override;
    void norm_matmul(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w, const Tensor& bias,
                     const Tensor& out, const Tensor& normed) override;
    void norm_matmul_silu(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w_gate_up,
                          const Tensor& out, const Tensor& normed, const Tensor& scratch) override;
    void matmul_add(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& scratch) override;
    void add(const Tensor& x, const Tensor& out) override;
    void fill_random(const Tensor& t, uint64_t seed, float lo, float hi) override;

    void begin_step(const BatchInput& batch) override;
    int step_bucket(int num_seqs) const override;
    void run_step(int key, const std::function<void()>& ops) override;
    void forget_steps() override { clear_graphs(); }

    void embedding(const Tensor& table, const int32_t* ids, int64_t n, const Tensor& out) override;
    void rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps, const Tensor& out) override;
    void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, bool exact = false) override;
    void rope_and_cache(const Tensor& q, const Tensor& k, const Tensor& v, const BatchInput& batch,
                        const RopeTable& rope, int head_dim, const Tensor& k_cache, const Tensor& v_cache) override;
    void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const BatchInput& batch,
                   int num_heads, int head_dim, float scale, int window, const Tensor& out) override;
    void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override;
    void copy_blocks(const Tensor& cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& out) override;

    cudaStream_t stream() const { return stream_; }
    void synchronize();
    // The device buffer [rows] where the sampler leaves its draws: a step's token id -1 - i is
    // replaced by feed[i] on the device. Drops graph recordings (they hold the old address).
    void set_token_feed(const int32_t* feed, int rows);
    // Device memory free and total, bytes.
    void memory_info(size_t& free_bytes, size_t& total_bytes) const;
    // Bytes of device memory this backend allocated for weights.
    size_t weight_bytes() const { return weight_bytes_; }
    int num_graphs() const { return static_cast<int>(graphs_.size()); }

  private:
    struct Gemm;  // a cached cuBLASLt plan for one (n, m, k, out dtype)
    struct Graph;
    void ensure_meta(int tokens, int seqs, int stride);
    void allocate_weight(Tensor& t);  // device memory for a placed weight, owned until destruction
    // out = x . w^T + beta * out through cuBLASLt (a cached plan per shape). The first use of a
    // decode-sized shape times the candidates, writing into `tune_out` (default: out; give a
    // scratch of out's shape when beta != 0, so out keeps what is accumulated into).
    void cublas_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta = 0.0f,
                       const Tensor& tune_out = Tensor());
    // Whether products of this x and w run through our decode kernel (and so may fuse epilogues).
    bool use_gemv(const Tensor& x, const Tensor& w) const;
    // The same for a product whose x is the f32 residual stream normalised by `norm_weight`.
    bool use_gemv_norm(const Tensor& x, const Tensor& norm_weight, const Tensor& w) const;
    void ensure_attention_workspace(size_t bytes);
    // The attention arguments of this step's batch over one layer's caches (no q, no workspace).
    cuda::AttentionArgs attention_args(const Tensor& k_cache, const Tensor& v_cache, int num_heads, int head_dim,
                                       float scale, int window, const Tensor& out) const;
    const float* rope_inv_freq(const RopeTable& rope);
    // Converts host rows [r0, r1) of `host` into `dst` (bf16 for matrices, else f32) on the device.
    void convert_rows_into(const Tensor& host, DType out_type, void* dst);
    const int32_t* device_ints(const int32_t* host, int64_t n, int32_t* scratch_slot);
    bool capturing() const;
    void clear_graphs();

    CudaOptions options_;
    int sm_count_ = 0;
    std::string device_name_;
    cudaStream_t stream_ = nullptr;
    void* lt_ = nullptr;  // cublasLtHandle_t
    void* lt_workspace_ = nullptr;
    size_t lt_workspace_bytes_ = 0;
    std::map<std::tuple<int64_t, int64_t, int64_t, int>, std::unique_ptr<Gemm>> gemms_;

    // Weights placed on the device, by host address (tied embeddings are placed once).
    std::unordered_map<const void*, Tensor> placed_;
    std::vector<void*> owned_;
    size_t weight_bytes_ = 0;

    // The current step's metadata (layout in begin_step): one device buffer and two pinned host
    // twins used in turn (a step may be prepared while the previous one's copy is still queued).
    int tok_cap_ = 0, seq_cap_ = 0, stride_cap_ = 0;
    int32_t* meta_dev_ = nullptr;
    int32_t* meta_host_[2] = {nullptr, nullptr};
    cudaEvent_t meta_copied_[2] = {nullptr, nullptr};  // after the copies out of each twin
    int meta_turn_ = 0;
    size_t meta_ints_ = 0;
    const int32_t* feed_ = nullptr;  // set_token_feed
    int feed_rows_ = 0;
    const BatchInput* step_ = nullptr;
    cuda::DeviceBatch dbatch_;
    const int32_t* d_logits_indices_ = nullptr;
    int32_t* scratch_ints_ = nullptr;  // [kScratchInts] for ids outside the step (pinned twin below)
    int32_t* scratch_host_ = nullptr;

    void* attn_ws_ = nullptr;
    size_t attn_ws_bytes_ = 0;
    void* stage_ = nullptr;  // pinned staging for weight uploads
    size_t stage_bytes_ = 0;

    std::map<int, std::unique_ptr<Graph>> graphs_;
};

}  // namespace peregrine
