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
#include "backend/scratch.h"

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
    // --quantization fp8: place_layer quantizes every layer matrix (not the embedding or LM head)
    // to E4M3 with one factor per output row; decode products read the FP8 bytes (gemv), larger
    // ones run cuBLASLt FP8 GEMMs on inputs quantized per token.
    bool fp8_weights = false;
    // --fp8-lm-head (with fp8_weights): the LM head to E4M3 as well; a tied head as an FP8 copy
    // (place_tied_head), the embedding kept for its gathers.
    bool fp8_lm_head = false;
    // FP8 GEMMs with both factor vectors in cuBLASLt (outer-vector scaling) where it has an
    // algorithm; false: always unit-factor GEMMs + scale_fp8_product (tests cover that path).
    bool fp8_outer_vectors = true;
    // GGUF layer matrices of type Q8_0, Q4_0, Q4_K and Q6_K stay quantized on the device, repacked
    // into the layouts of core/gpu_quant.h (false, or batch-invariant mode: bf16 as before).
    bool gguf_quantized = true;
    // The bf16 buffer larger GGUF products dequantize into, at most this many elements (256 MiB):
    // a matrix larger than it (the 8B's 128k-row head: 1 GiB as bf16) is multiplied in row
    // chunks that fit, so the KV pool keeps the difference.
    int64_t gguf_scratch_elements = int64_t{128} << 20;
    // GGUF products of more rows than this dequantize into that buffer for cuBLASLt; up to it
    // they run on gguf_gemm (tensor cores, the codes unpacked in registers). -1: the default,
    // or PEREGRINE_GGUF_GEMM_MAX_ROWS (0: every product past the decode kernels dequantizes).
    int gguf_gemm_max_rows = -1;
};

// Whether a CUDA device is present (never throws).
bool cuda_device_available();
int cuda_device_count();  // 0 without a usable GPU (never throws)

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(const CudaOptions& options = {});
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    Device device() const override { return Device::CUDA; }
    std::string name() const override;

    // ---- device services (device.h) -------------------------------------------------------------
    Tensor allocate(DType dtype, std::initializer_list<int64_t> shape) override;
    void release(Tensor& t) override;
    void upload(const void* src, const Tensor& dst) override;
    void download(const Tensor& src, void* dst) override;
    Tensor place_weight(const Tensor& host, bool matrix) override;
    // A GGUF LM head stays quantized (place_layer_matrix); others as place_weight, then to FP8
    // with fp8_lm_head.
    Tensor place_lm_head(const Tensor& host) override;
    // With fp8_lm_head an FP8 copy of a bf16 embedding (which stays for its gathers), else itself.
    Tensor place_tied_head(const Tensor& placed_embedding) override;
    // A GGUF embedding stays quantized too (gathered by gguf_embedding; the dequantize buffer
    // grows for it only when it is also the head).
    Tensor place_embedding(const Tensor& host, bool tied_head) override {
        return place_layer_matrix({host}, tied_head);
    }
    void fill_random(const Tensor& t, uint64_t seed, float lo, float hi) override;
    void copy_blocks(const Tensor& cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) override;
    // Pinned (cudaHostAlloc), so the copies below run asynchronously.
    void* allocate_host(size_t bytes) override;
    void free_host(void* p) override;
    // cudaMemcpyAsync per block and cache on the copy stream, which first waits for everything
    // queued on the compute stream so far; the compute stream then waits for the copies.
    void copy_blocks_to_host(const std::vector<Tensor>& caches, const std::vector<std::pair<int32_t, int32_t>>& pairs,
                             void* host, size_t slot_bytes) override;
    void copy_blocks_from_host(const void* host, size_t slot_bytes,
                               const std::vector<std::pair<int32_t, int32_t>>& pairs,
                               const std::vector<Tensor>& caches) override;
    void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t rows,
                      int64_t cols) override;
    void* native_stream() override { return stream_; }
    int device_index() const override { return options_.device; }
    void make_current() override;
    void synchronize() override;
    bool memory_info(size_t& free_bytes, size_t& total_bytes) const override;
    void begin_step(const BatchInput& batch) override;
    int step_bucket(int num_seqs) const override;
    void run_step(int key, const std::function<void()>& ops) override;
    void forget_steps() override { clear_graphs(); }
    void end_warm_up() override { warm_up_over_ = true; }

    // ---- blocks (backend.h) ---------------------------------------------------------------------
    bool supports_weight_dtype(DType t) const override;
    DType activation_dtype() const override { return DType::BF16; }
    DType native_kv_cache_dtype() const override { return DType::BF16; }
    // Stacks q/k/v into wqkv (+ bqkv) unless the layer has qk-norm, and gate/up into w_gate_up.
    LayerWeights place_layer(const LayerWeights& host) override;
    void embedding(const Tensor& table, const int32_t* ids, int64_t n, const Tensor& out, int32_t vocab_begin) override;
    // Stacked q/k/v: norm_matmul, rope_cache_attention, matmul_add. qk-norm: the ops apart
    // (unfused_blocks.h), then matmul_add.
    void attention_block(const Tensor& residual, const LayerWeights& w, const AttentionParams& p,
                         const BatchInput& batch, const Tensor& k_cache, const Tensor& v_cache) override;
    // norm_matmul_silu, matmul_add.
    void mlp_block(const Tensor& residual, const LayerWeights& w, float norm_eps, Communicator* tp) override;
    // rms_norm, gather_rows (unless every row is wanted), matmul: not norm_matmul, as folding
    // the norm into the LM head's many CTAs cost more than the norm kernel on an H100.
    void logits(const Tensor& residual, const Tensor& final_norm, float norm_eps, const Tensor& lm_head,
                const BatchInput& batch, const Tensor& out) override;

    // ---- the ops the blocks run -----------------------------------------------------------------
    // Not part of Backend: public so tests/cuda can hold fused forms against the ops apart.
    // Activations bf16 [rows, cols] unless noted; the residual stream f32. Ops that read the
    // step's batch must get the one given to begin_step.

    // With `residual` non-empty: residual += x, then out = rms_norm(residual) * weight; else
    // out = rms_norm(x) * weight. x, out: f32 or bf16 [rows, dim]; weight: [dim] f32.
    void rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps, const Tensor& out);
    // out [n, m] (f32 or bf16) = x [n, k] · w [m, k]ᵀ (+ bias [m] f32). `exact` is ignored
    // (bf16 inputs with f32 accumulation in every mode). w bf16, or f8_e4m3 with row factors.
    void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out, bool exact = false);
    // As CpuBackend::rope_and_cache: rotates q, k in place, writes k, v to the cache.
    void rope_and_cache(const Tensor& q, const Tensor& k, const Tensor& v, const BatchInput& batch,
                        const RopeTable& rope, int head_dim, const Tensor& k_cache, const Tensor& v_cache);
    // Paged attention, as CpuBackend::attention. q, out: [n, num_heads * head_dim].
    void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const BatchInput& batch,
                   int num_heads, int head_dim, float scale, int window, const Tensor& out);
    // out = silu(gate) * up; all [n, dim].
    void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out);
    // out += x, both f32 of one shape.
    void add(const Tensor& x, const Tensor& out);
    // out[i] = x[rows[i]]; x: [n, dim], out: [rows.size(), dim].
    void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& out);

    // The stacked forms: qkv [n, q_dim + 2 kv_dim] holds q | k | v per row; rotates like
    // rope_and_cache, writes the rotated q to q_out [n, q_dim] and k, v to the cache.
    void rope_and_cache_packed(const Tensor& qkv, const Tensor& q_out, const BatchInput& batch, const RopeTable& rope,
                               int head_dim, int num_kv_heads, const Tensor& k_cache, const Tensor& v_cache);
    // gate_up [n, 2 dim] holds gate | up per row; out [n, dim] = silu(gate) * up.
    void silu_mul_packed(const Tensor& gate_up, const Tensor& out);

    // Fused steps, each one kernel where it applies, else the ops apart:
    // rope_and_cache_packed(qkv, q, ...) then attention(q, ...) into out [n, num_heads * head_dim].
    // One kernel (cuda::rope_cache_attention) for pure-decode batches of <= 4 sequences outside
    // batch-invariant mode, which may leave q unwritten (attention is its only reader).
    void rope_cache_attention(const Tensor& qkv, const Tensor& q, const BatchInput& batch, const RopeTable& rope,
                              int head_dim, int num_kv_heads, const Tensor& k_cache, const Tensor& v_cache,
                              int num_heads, float scale, int window, const Tensor& out);
    // out [n, dim] = silu(x · gateᵀ) * (x · upᵀ) for w_gate_up [2 dim, k]; scratch [n, 2 dim]
    // holds the product where the steps run apart (matmul, silu_mul_packed).
    void matmul_silu(const Tensor& x, const Tensor& w_gate_up, const Tensor& out, const Tensor& scratch);
    // out = (rms_norm(x) * norm_weight) · wᵀ (+ bias) for x [n, k] f32 (the residual stream);
    // `normed` [n, k] bf16 holds the normalised rows where the steps run apart.
    void norm_matmul(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w, const Tensor& bias,
                     const Tensor& out, const Tensor& normed);
    // The same before matmul_silu: out [n, dim] = silu(h · gateᵀ) * (h · upᵀ), h = rms_norm(x) * norm_weight.
    void norm_matmul_silu(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w_gate_up,
                          const Tensor& out, const Tensor& normed, const Tensor& scratch);
    // residual [n, m] f32 += x · wᵀ; `scratch` [n, m] f32 holds the product where the steps run
    // apart (batch-invariant mode) and the candidates' outputs while cuBLASLt is timed.
    void matmul_add(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& scratch);

    cudaStream_t stream() const { return stream_; }
    // The device buffer [rows] where the sampler leaves its draws: a step's token id -1 - i is
    // replaced by feed[i] on the device. Drops graph recordings (they hold the old address).
    void set_token_feed(const int32_t* feed, int rows);
    // Bytes of device memory this backend allocated for weights.
    size_t weight_bytes() const override { return weight_bytes_; }
    // Elements of the bf16 buffer the larger GGUF products dequantize into (0: none).
    int64_t gguf_scratch_elements() const { return gguf_scratch_.numel(); }
    std::unique_ptr<DeviceSampler> make_sampler(int max_rows, int vocab) override;
    int num_graphs() const { return static_cast<int>(graphs_.size()); }

  private:
    // residual += x · wᵀ where this rank holds a slice of k and the partial product is summed
    // over `tp`: one kernel for the sum and the add where `tp` is a PeerCommunicator and the
    // message fits, else the communicator's all-reduce and an add.
    void add_product(const Tensor& x, const Tensor& w, const Tensor& residual, const Tensor& product, Communicator* tp);
    // One weight whose rows are the rows of `parts` in order (same columns; vectors concatenate),
    // placed like place_weight. Parts may already be on the device (dummy weights).
    Tensor place_stacked(const std::vector<Tensor>& parts, bool matrix);
    // Whether host matrices `parts` (stacked in this order) stay FP8 on the device: all
    // f8_e4m3 with row factors (an FP8 checkpoint), k a multiple of 16, not batch-invariant.
    // Otherwise they become bf16 (convert_rows_into applies the factors).
    bool keeps_fp8(const std::vector<Tensor>& parts) const;
    // One f8_e4m3 [sum of rows, k] device matrix of `parts` (keeps_fp8), codes copied as they
    // are, Tensor::scale at the parts' f32 row factors concatenated (device memory, owned).
    Tensor place_fp8(const std::vector<Tensor>& parts);
    // GGUF matrices (cuda_gguf.cc). Whether host matrices `parts` stay quantized: all of a
    // type with a device layout (Q8_0, Q4_0, Q4_K, Q6_K), one layout among them, same k,
    // gguf_quantized on and not batch-invariant.
    bool keeps_gguf(const std::vector<Tensor>& parts) const;
    // One [sum of rows, k] device matrix of `parts` (keeps_gguf) in their device layout.
    // product: the larger products will dequantize it (gguf_scratch_ is grown to its size, up to
    // options_.gguf_scratch_elements).
    Tensor place_gguf(const std::vector<Tensor>& parts, bool product = true);
    // A layer matrix: kept quantized where keeps_gguf allows, else place_weight / place_stacked.
    // product: as place_gguf's (false: only gathered, as an untied embedding).
    Tensor place_layer_matrix(const std::vector<Tensor>& parts, bool product = true);
    // out (+)= x . w^T for a GGUF-layout w: w dequantized into gguf_scratch_ (bf16), then cuBLASLt.
    void gguf_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta, const Tensor& tune);
    struct Gemm;  // a cached cuBLASLt plan for one (n, m, k, out dtype)
    struct Graph;
    // An f8_e4m3 copy of a placed bf16 matrix (per-row factors); the bf16 one is freed where this
    // backend owns it, unless keep. Matrices whose k is not a multiple of 16 (cuBLASLt FP8) stay bf16.
    Tensor quantize_weight(const Tensor& w, bool keep = false);
    // FP8 prefill inputs quantized where they are made (as quantize_rows_e4m3 would quantize the
    // bf16 row, bit for bit), skipping the bf16 row: x is f8_e4m3 with Tensor::scale at its row
    // factors (fp8_pair); matmul and matmul_add take such an x for an f8_e4m3 weight.
    static bool fp8_pair(const Tensor& x, const Tensor& w);
    // An f8_e4m3 [n, k] view of f8_input_ with scale at f8_scale_ (ensure_fp8_buffers; the
    // norm's and the silu's outputs share them: each is read by the product right after it,
    // which then leaves f8_input_ alone).
    Tensor fp8_activation(int64_t n, int64_t k);
    // rms_norm(x) * norm_weight as the f8_e4m3 input of w, or empty where w is not f8_e4m3 (or
    // the kernel does not take the row): then the caller goes the bf16 way.
    Tensor norm_e4m3(const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w);
    // silu(gate) * up of gate_up [n, 2F] bf16 as the f8_e4m3 input of w (the down product), or empty.
    Tensor silu_e4m3(const Tensor& gate_up, const Tensor& w);
    // Room for an FP8 product: `input` e4m3 values of x, `rows` factors, `product` bf16 values of
    // one GEMM's unscaled output. Each grows alone, outside graph recording only (the largest
    // step runs first).
    void ensure_fp8_buffers(int64_t input, int64_t rows, int64_t product);
    // out (+)= x · wᵀ for an f8_e4m3 w: x quantized per token, then one cuBLASLt FP8 GEMM with
    // both factor vectors (outer-vector scaling); where cuBLASLt has no algorithm for that, GEMMs
    // with unit factors into a bf16 buffer and scale_fp8_product (beta 1: adds into out).
    void fp8_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta, const Tensor& tune);
    // D [n, m] (row-major) = x [n, k] · w [m, k]ᵀ + beta D through a cached cuBLASLt plan, bf16 or
    // (fp8) e4m3 operands; `tune` receives the candidates' outputs while a new plan is timed. With
    // w_scale / x_scale ([m] / [n] f32): D[i, j] *= w_scale[i] * x_scale[j]; returns false when
    // cuBLASLt has no algorithm for that (otherwise true, or it fails).
    // ldd: elements between D's rows (out[j] starts at j * ldd; 0: m), for products that fill a
    // column band [.., m) of a wider out.
    bool lt_matmul(const void* w, const void* x, bool fp8, int64_t n, int64_t m, int64_t k, void* out, DType out_dtype,
                   float beta, void* tune, const float* w_scale = nullptr, const float* x_scale = nullptr,
                   int64_t ldd = 0);
    void ensure_meta(int tokens, int seqs, int stride);
    void allocate_weight(Tensor& t);  // device memory for a placed weight, owned until destruction
    // The same for an f8_e4m3 weight [rows, cols] and its [rows] factors (Tensor::scale).
    Tensor allocate_fp8_weight(int64_t rows, int64_t cols);
    // out = x . w^T + beta * out through cuBLASLt (a cached plan per shape; an f8_e4m3 w goes to
    // fp8_matmul). The first use of a
    // decode-sized shape times the candidates, writing into `tune_out` (default: out; give a
    // scratch of out's shape when beta != 0, so out keeps what is accumulated into).
    void cublas_matmul(const Tensor& x, const Tensor& w, const Tensor& out, float beta = 0.0f,
                       const Tensor& tune_out = Tensor());
    // Whether products of this x and w run through our decode kernel (and so may fuse epilogues).
    bool use_gemv(const Tensor& x, const Tensor& w) const;
    // The same for a product whose x is the f32 residual stream normalised by `norm_weight`.
    bool use_gemv_norm(const Tensor& x, const Tensor& norm_weight, const Tensor& w) const;
    // The same for the o / down products, which add into the residual stream (matmul_add).
    bool use_gemv_add(const Tensor& x, const Tensor& w) const;
    // The same for a plain FP8 product of up to 8 rows (the tensor-core kernel, x kept bf16).
    bool use_gemv_fp8(const Tensor& x, const Tensor& w) const;
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
    // The host-tier copies of one call: each pair's block rows of every cache, one way.
    void host_copies(bool to_host, const std::vector<Tensor>& caches,
                     const std::vector<std::pair<int32_t, int32_t>>& pairs, char* host, size_t slot_bytes);

    CudaOptions options_;
    int sm_count_ = 0;
    std::string device_name_;
    cudaStream_t stream_ = nullptr;
    // The host tier's copies (created on first use): their own stream, ordered against stream_
    // by copy_ready_ (compute so far -> copies) and copy_done_ (copies -> later compute).
    // Overlapped (default; PEREGRINE_TIER_OVERLAP=0: the step waits for all of them first): each
    // cache tensor's pieces get their own kernel and event (cache_events_), and the compute
    // stream waits for a tensor's event only where it first touches that tensor (await_cache:
    // the RoPE / cache write, attention, copy-on-write), so layer L's copies run under layers
    // < L. A recorded step, synchronize() and capture wait for all of them (await_all_caches).
    cudaStream_t copy_stream_ = nullptr;
    void* host_copy_list_ = nullptr;  // device: [host_copy_capacity_] cuda::HostCopy
    size_t host_copy_capacity_ = 0;
    cudaEvent_t copy_ready_ = nullptr;
    cudaEvent_t copy_done_ = nullptr;
    std::vector<cudaEvent_t> cache_events_;                     // by index in the caches of a call
    std::vector<std::pair<const void*, cudaEvent_t>> pending_;  // cache data -> its copies' event
    std::vector<std::pair<const void*, cudaEvent_t>>::iterator pending_for(const Tensor& cache);
    void await_cache(const Tensor& cache);
    void await_all_caches();
    void* lt_ = nullptr;  // cublasLtHandle_t
    void* lt_workspace_ = nullptr;
    size_t lt_workspace_bytes_ = 0;
    // cuBLASLt plans by (n, m, k, out dtype | fp8 | outer-vector flags, ldd).
    std::map<std::tuple<int64_t, int64_t, int64_t, int, int64_t>, std::unique_ptr<Gemm>> gemms_;
    // After the warm-up a new skinny shape takes the heuristic's first pick instead of timing the
    // candidates (a device wait inside a step); PEREGRINE_GEMM_TUNE=always times them then too.
    bool warm_up_over_ = false;

    // Weights placed on the device, by host address (tied embeddings are placed once).
    std::unordered_map<const void*, Tensor> placed_;
    std::vector<void*> owned_;
    Tensor f8_input_, f8_scale_, f8_product_;  // see ensure_fp8_buffers
    // [largest GGUF-layout matrix] bf16: a weight dequantized for one cuBLASLt product; sized as
    // matrices are placed, so it never grows during a step.
    Tensor gguf_scratch_;
    bool fp8_outer_vectors_ = true;  // options_.fp8_outer_vectors until cuBLASLt finds none
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
    void* stage_ = nullptr;  // pinned staging for weight uploads (ensure_stage)
    size_t stage_bytes_ = 0;
    void ensure_stage();

    std::map<int, std::unique_ptr<Graph>> graphs_;
    Scratch scratch_{*this};  // the blocks' buffers (scratch.h)
};

}  // namespace peregrine
