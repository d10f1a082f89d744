// Host-side launchers of Peregrine's own CUDA kernels. Plain C++ (no CUDA headers), so the
// backend and the tests include it from .cc files. Every pointer is device memory unless
// noted; every launcher enqueues on `stream` and returns at once (no synchronisation, no
// allocation). A launcher checks its launch with cudaGetLastError and throws peregrine::Error.
//
// Element types: activations are bf16 (`uint16_t` bit patterns) unless a parameter says f32;
// the residual stream and all norm weights are f32; the KV cache is bf16
// [num_blocks, block_size, num_kv_heads, head_dim], or FP8 (the *_fp8 launchers and
// AttentionArgs::k_fp8): per block, E4M3 codes [block_size, num_kv_heads, head_dim] then bf16
// scales [block_size, num_kv_heads] (core/kv_fp8.h), block_size * num_kv_heads a multiple of 4.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/sampling_row.h"

typedef struct CUstream_st* cudaStream_t;

namespace peregrine::cuda {

using bf16_t = uint16_t;  // raw bf16 bits in host code

// One step's flattened batch in device memory (see model/batch.h for the meaning of each
// field). Graph-safe: a CUDA graph captured with one DeviceBatch is replayed after new values
// are copied into the same buffers, so kernels must read lengths from these arrays and use
// the scalar fields only for grid sizing that stays valid for the whole bucket.
// Decode attention merges its key splits in a thread-block cluster up to this many sequences
// (and fuses RoPE + the cache write for pure-decode batches).
constexpr int kClusterMaxSeqs = 4;
// Such batches whose contexts all fit in this many tokens take another shape.
constexpr int kShortDecodeContext = 256;
// The decode attention's context class: its launch shape depends on it, so a graph recorded for
// a step is valid only for steps of the same class (CudaBackend::run_step keys recordings by it).
inline bool short_decode_class(int num_seqs, int max_context) {
    return num_seqs <= kClusterMaxSeqs && max_context <= kShortDecodeContext;
}

struct DeviceBatch {
    int num_tokens = 0;
    int num_seqs = 0;
    int block_stride = 0;                   // ints per row of block_tables (a fixed capacity)
    int block_size = 16;                    // tokens per KV block
    int max_query_len = 0;                  // upper bound over sequences of query length (host-known)
    int max_context_len = 0;                // upper bound over sequences of context_lens (host-known)
    const int32_t* token_ids = nullptr;     // [num_tokens]
    const int32_t* positions = nullptr;     // [num_tokens]
    const int32_t* query_start = nullptr;   // [num_seqs + 1]
    const int32_t* context_lens = nullptr;  // [num_seqs]; 0 marks a padding sequence (no output needed)
    const int32_t* block_tables = nullptr;  // [num_seqs, block_stride], -1 past the end
    const int32_t* slot_mapping = nullptr;  // [num_tokens]; -1 marks a padding token (no cache write)
};

// out[i, :] = f32(table[ids[i], :]). table: [vocab, hidden] bf16; out: [n, hidden] f32. An id
// -1 - j stands for feed[j] (the previous step's draw j; async scheduling); with no feed,
// negative ids give zero rows.
void embedding(const bf16_t* table, const int32_t* ids, const int32_t* feed, int n, int hidden, int vocab_begin,
               int vocab_rows, float* out, cudaStream_t stream);

// With residual != nullptr: residual += x; out = rms_norm(residual) * weight.
// Otherwise out = rms_norm(x) * weight. x is f32 when x_f32 else bf16; out is f32 when out_f32
// else bf16; out may alias x (same dtype). rows x dim; weight [dim] f32. Sums in f32.
void rms_norm(const void* x, bool x_f32, float* residual, const float* weight, float eps, void* out, bool out_f32,
              int rows, int dim, cudaStream_t stream);

// Rotates q [n, num_heads*head_dim] and k [n, num_kv_heads*head_dim] (bf16, in place) at
// batch.positions using inv_freq [rotary_dim/2] f32 (angle = position * inv_freq[i], both f32,
// cos/sin scaled by attention_factor), the first rotary_dim dims of each head; neox pairs
// (i, i + rotary_dim/2), otherwise interleaved pairs (2i, 2i+1). Then writes k and v
// [n, num_kv_heads*head_dim] into k_cache/v_cache at batch.slot_mapping (skipping -1).
void rope_and_cache(bf16_t* q, bf16_t* k, const bf16_t* v, const DeviceBatch& batch, const float* inv_freq,
                    int rotary_dim, float attention_factor, bool neox, int num_heads, int num_kv_heads, int head_dim,
                    bf16_t* k_cache, bf16_t* v_cache, cudaStream_t stream);

// The packed form: qkv [n, (num_heads + 2 num_kv_heads) * head_dim] holds q | k | v per row
// (one matmul's output). Rotated q goes to q_out [n, num_heads * head_dim]; k (rotated) and v
// go to the cache only. qkv's k part is rotated in place.
void rope_and_cache_packed(bf16_t* qkv, bf16_t* q_out, const DeviceBatch& batch, const float* inv_freq, int rotary_dim,
                           float attention_factor, bool neox, int num_heads, int num_kv_heads, int head_dim,
                           bf16_t* k_cache, bf16_t* v_cache, cudaStream_t stream);

// The same two into FP8 caches (batch.block_size tokens a block): each (token, kv head) of k
// (rotated) and v is quantized with its own scale, bit for bit as kv_fp8_quantize_head does on
// the host with the bf16 values the bf16 launchers would have written.
void rope_and_cache_fp8(bf16_t* q, bf16_t* k, const bf16_t* v, const DeviceBatch& batch, const float* inv_freq,
                        int rotary_dim, float attention_factor, bool neox, int num_heads, int num_kv_heads,
                        int head_dim, uint8_t* k_cache, uint8_t* v_cache, cudaStream_t stream);
void rope_and_cache_packed_fp8(bf16_t* qkv, bf16_t* q_out, const DeviceBatch& batch, const float* inv_freq,
                               int rotary_dim, float attention_factor, bool neox, int num_heads, int num_kv_heads,
                               int head_dim, uint8_t* k_cache, uint8_t* v_cache, cudaStream_t stream);

// out [n, dim] = silu(gate) * up with gate_up [n, 2 dim] holding gate | up per row.
void silu_mul_packed(const bf16_t* gate_up, bf16_t* out, int64_t n, int64_t dim, cudaStream_t stream);

// out = silu(gate) * up, all [n, dim] bf16 (computed in f32). out may alias gate.
void silu_mul(const bf16_t* gate, const bf16_t* up, bf16_t* out, int64_t n, int64_t dim, cudaStream_t stream);

// out[i, :] = x[rows[i], :]; x, out bf16 [*, dim]; rows: [n] device.
void gather_rows(const bf16_t* x, const int32_t* rows, int n, int dim, bf16_t* out, cudaStream_t stream);

// Copy-on-write of KV blocks: cache[pairs[2i+1]] = cache[pairs[2i]] for i < n_pairs;
// block_elems = a block's bytes / 2 (bf16: block_size * num_kv_heads * head_dim values; FP8: the
// codes and scales of the block, moved as 2-byte units).
void copy_blocks(bf16_t* cache, const int32_t* pairs, int n_pairs, int64_t block_elems, cudaStream_t stream);

// One piece of a KV host-tier move: `bytes` (a multiple of 16) from src to dst, both 16-byte
// aligned, either side device memory or a pinned host buffer's device alias.
struct HostCopy {
    void* dst;
    const void* src;
    uint32_t bytes;
};
// Every piece of `d_copies` ([n], in device memory), in one launch.
// max_ctas bounds the grid (fewer CTAs leave the SMs to compute running beside the copies).
void host_copies(const HostCopy* d_copies, int n, cudaStream_t stream, int max_ctas = 4096);

// Fills n values with a deterministic function of (seed, index): uniform in [-scale, scale].
void fill_random_bf16(bf16_t* out, int64_t n, uint64_t seed, float scale, cudaStream_t stream);
void fill_random_f32(float* out, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);

// out[i, :] = bias (f32 [m]) added to x [n, m] bf16, in place.
void add_bias(bf16_t* x, const float* bias, int64_t n, int64_t m, cudaStream_t stream);

// A decode product's weight [m, k]: bf16; FP8 E4M3 values with one f32 factor per row, element
// (r, c) = value(r, c) * scale[r]; or a GGUF matrix in one of the device layouts of core/dtype.h
// (gq8_32, gq8_16, gq4_32, gq6_32): `data` its codes, `factors` its f16 factors (the same allocation).
struct GemvWeight {
    enum Kind { kBf16, kF8, kI8B32, kI8B16, kU4, kU6 };
    const void* data = nullptr;
    const float* scale = nullptr;
    const void* factors = nullptr;
    Kind kind = kBf16;
    GemvWeight(const bf16_t* w) : data(w) {}  // NOLINT: a bf16 matrix converts implicitly
    GemvWeight(const uint8_t* w, const float* row_scale) : data(w), scale(row_scale), kind(kF8) {}
    GemvWeight(Kind k, const void* codes, const void* f) : data(codes), factors(f), kind(k) {}
    // k must be a multiple of this: whole 16-byte chunks of codes, whole factor blocks.
    int k_multiple() const { return kind == kBf16 ? 8 : kind == kF8 || kind == kI8B16 ? 16 : kind == kU6 ? 64 : 32; }
};

// Skinny product for decode: out[n, m] = x[n, k] . w[m, k]^T, bf16 (or e4m3) in, f32 accumulate,
// out f32 (out_f32) or bf16. n <= max_gemv_rows(w.kind), k a multiple of 8, x and w 16-byte
// aligned.
constexpr int kMaxGemvRows = 4;
// The most rows of x the products below take for a weight of this kind: kMaxMmaRows (gemv_mma.h,
// 8). GGUF layouts past kMaxGemvRows in slices of kMaxGemvRows rows, each reading the weight
// once more; bf16 and FP8 past kMaxGemvRows only where the tensor-core kernel takes the product
// (gemv_mma_takes), else the call fails.
int max_gemv_rows(GemvWeight::Kind kind);
// The most rows the backend hands these products for a weight of this kind (more go to
// cuBLASLt, or for the GGUF layouts to gguf_gemm): 2 for bf16 and FP8, whose products of 3-4 rows
// cuBLASLt's GEMMs run faster (H200, 8B bf16 decode at batch 4: 878.2 vs 685.5 tok/s),
// PEREGRINE_GEMV_MAX_ROWS (1..kMaxGemvRows) overriding it (the backend lets products of 3-4
// rows through where gemv_mma_takes them: CudaBackend::use_gemv_norm / use_gemv_add); 4 for the GGUF
// layouts, whose products of 5-8 rows gguf_gemm runs faster than slices,
// PEREGRINE_GGUF_GEMV_MAX_ROWS (1..8) overriding it.
int gemv_rows_chosen(GemvWeight::Kind kind);
// Whether the products below take n rows of x (at most max_rows) with this k and these operands.
bool gemv_supported(int n, int k, const void* x, const void* w, int max_rows = kMaxGemvRows);
void gemv(const bf16_t* x, GemvWeight w, void* out, bool out_f32, int n, int m, int k, cudaStream_t stream);
// gemv with gate | up fused: w_gate_up [m, k] holds gate rows then up rows (m even);
// out [n, m/2] bf16 = silu(x . gate^T) * (x . up^T), computed in f32.
void gemv_silu(const bf16_t* x, GemvWeight w_gate_up, bf16_t* out, int n, int m, int k, cudaStream_t stream);
// The products of rms_norm(x) * norm for x f32 [n, k] (the residual stream), norm f32 [k]: the
// norm folded into the product (x^2 summed in the same pass, the dot products scaled by
// 1 / sqrt(mean(x^2) + eps)), so no normalised copy of x is written. norm 16-byte aligned.
void gemv_norm(const float* x, const float* norm, float eps, GemvWeight w, void* out, bool out_f32, int n, int m, int k,
               cudaStream_t stream);
void gemv_norm_silu(const float* x, const float* norm, float eps, GemvWeight w_gate_up, bf16_t* out, int n, int m,
                    int k, cudaStream_t stream);
// out [n, m] f32 += x . w^T: the o / down products added straight into the residual stream.
void gemv_add(const bf16_t* x, GemvWeight w, float* out, int n, int m, int k, cudaStream_t stream);
// A GGUF-layout weight (kind kI8B32, kI8B16, kU4 or kU6) [m, k] written out as bf16 [m, k], for the
// cuBLASLt products of larger batches.
void dequantize_weight(GemvWeight w, bf16_t* out, int m, int k, cudaStream_t stream);
// embedding() over a GGUF-layout table (w: [vocab_rows, hidden]): each row's layout values in f32
// (dequantize_weight's before their bf16 rounding); ids and feed as embedding().
void gguf_embedding(GemvWeight w, const int32_t* ids, const int32_t* feed, int n, int hidden, int vocab_begin,
                    int vocab_rows, float* out, cudaStream_t stream);
// FP8: q [rows, cols] e4m3 and scale [rows] f32 from x [rows, cols] bf16, one factor a row
// (amax / 448; q = x * 448 / amax rounded to nearest even, saturating). cols a multiple of 8.
void quantize_rows_e4m3(const bf16_t* x, uint8_t* q, float* scale, int64_t rows, int64_t cols, cudaStream_t stream);
// Prefill inputs of FP8 products quantized where they are made, without the bf16 row in
// between: codes [rows, dim] e4m3 and scale [rows] equal bit for bit what quantize_rows_e4m3
// gives for the bf16 output of rms_norm (x, residual, weight as there) or of silu_mul_packed
// (gate_up [rows, 2 dim]). False, launching nothing, where the row is too long to stay in
// registers (dim > 32768) or dim / the pointers are not 8-element / 16-byte aligned.
bool rms_norm_e4m3(const void* x, bool x_f32, float* residual, const float* weight, float eps, uint8_t* codes,
                   float* scale, int rows, int dim, cudaStream_t stream);
bool silu_rows_e4m3(const bf16_t* gate_up, uint8_t* codes, float* scale, int64_t rows, int64_t dim,
                    cudaStream_t stream);
// An FP8 GEMM's epilogue: out [n, m] (f32, or bf16) = d * w_scale[col] * x_scale[row], or
// (accumulate) out += that; d [n, m] bf16 is the GEMM's output with unit factors.
void scale_fp8_product(const bf16_t* d, const float* w_scale, const float* x_scale, void* out, bool out_f32,
                       bool accumulate, int64_t n, int64_t m, cudaStream_t stream);
// out += x, both f32 with n elements.
void add_f32(const float* x, float* out, int64_t n, cudaStream_t stream);
// Test hook: rows per CTA and 16-byte chunks in flight per row and thread, one of 2x1, 2x2,
// 2x4, 1x4, 1x8, of the one-CTA-per-row-block kernel, which then takes every product (0, 0:
// chosen by k, and at n = 1 some products take the persistent kernel).
void set_gemv_config(int rows, int depth);
// Whether the GGUF device layouts' normed and add products at n = 1 take the persistent kernel
// (x staged once a CTA, several rows a block) instead of one short CTA per row pair:
// PEREGRINE_GGUF_GEMV=persistent | blocks (default persistent: 1.3-1.9x faster batch-1 decode on
// an H100, docs/PERFORMANCE.md). Test hook:
// 1 / 0 override the variable, -1 goes back to it.
void set_gguf_gemv_persistent(int mode);

// ---- batch-invariant products -------------------------------------------------------------------
// out[n, m] = x[n, k] . w[m, k]^T, bf16 in, f32 accumulate on tensor cores, out f32 (out_f32)
// or bf16. Batch-invariant: every output element is a function of its x row and w row only,
// bitwise the same for any n and any position of the row in the batch (one fixed k order, no
// split-K across CTAs; gemm_invariant.cu describes it). Any k >= 1 and any alignment (k % 8 == 0
// with 16-byte aligned x and w takes the fast paths; others give the same bits, slower).
void gemm_invariant(const bf16_t* x, const bf16_t* w, void* out, bool out_f32, int n, int m, int k,
                    cudaStream_t stream);
// Test / benchmark hook (process-wide): force one kernel plan. Every plan gives the same bits.
// Skinny*: loads into registers (the unaligned fallback); Sliced*: a warp per k slice, 8..64
// tokens a CTA; Tiled*: shared tiles of tokens x weights (TiledWide: 128 x 256).
enum class GemmInvariantPlan {
    Auto = -1,
    SkinnyR1,
    SkinnyR2,
    Sliced8,
    Sliced16,
    Sliced32,
    Sliced64,
    Sliced64W,
    Tiled32,
    Tiled64,
    Tiled128,
    TiledWide,
    TiledWide4,
    TiledWideK64,
};
void set_gemm_invariant_plan(GemmInvariantPlan plan);

// ---- attention -----------------------------------------------------------------------------
struct AttentionArgs {
    const bf16_t* q = nullptr;  // [num_tokens, num_heads * head_dim]
    const bf16_t* k_cache = nullptr;
    const bf16_t* v_cache = nullptr;
    // FP8 caches (core/kv_fp8.h): when set, every kernel reads these and k_cache / v_cache are
    // not read. Set both or neither.
    const uint8_t* k_fp8 = nullptr;
    const uint8_t* v_fp8 = nullptr;
    bf16_t* out = nullptr;  // [num_tokens, num_heads * head_dim]
    DeviceBatch batch;
    int num_heads = 0, num_kv_heads = 0, head_dim = 0;
    float scale = 1.0f;  // softmax scale applied to q·k
    int window = 0;      // > 0: query at position p sees keys in (p - window, p]
    // Split-KV scratch (decode): at least attention_workspace_bytes(...) bytes.
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    // Every query token's output bitwise independent of the rest of the batch, of how its
    // prompt was chunked and of its sequence's query length (one kernel path for all tokens,
    // keys in fixed partitions folded in order; attention_invariant.cu). Slower for decode.
    bool batch_invariant = false;
};

// Scratch the attention launchers need for a batch of up to max_tokens tokens, in either mode
// (the 4-argument form: in the one mode AttentionArgs::batch_invariant selects).
size_t attention_workspace_bytes(int max_tokens, int num_heads, int head_dim);
size_t attention_workspace_bytes(int max_tokens, int num_heads, int head_dim, bool batch_invariant);

// Causal paged attention of every token of the batch over its sequence's cache (which
// already holds this step's keys/values): query token t of sequence s at position p reads
// cache positions [0, p] (or (p - window, p]). Chooses the kernel itself: a decode kernel
// when every query length is 1 (batch.max_query_len == 1), else the prefill kernel (or, with
// batch_invariant, the invariant kernels for every token). Graph-safe for decode batches: its
// launch shape depends only on num_seqs, num_heads, head_dim (and num_tokens, max_query_len).
// head_dim: any of 8, 16, 32, 64, 80, 96, 128, 256 (tensor cores for 64 and 128).
void paged_attention(const AttentionArgs& args, cudaStream_t stream);

// The decode step's RoPE + KV-cache write + attention in one kernel, for a pure-decode batch of
// a few sequences (rope_cache_attention_supported): what rope_and_cache_packed followed by
// paged_attention compute, minus the rotated q (q_out), which nothing else reads. qkv
// [num_seqs, (num_heads + 2 num_kv_heads) * head_dim] as rope_and_cache_packed takes it (the
// rope parameters too); k (rotated) and v of token s go to the cache slot slot_mapping[s]
// (skipped when < 0), bit for bit as rope_and_cache_packed writes them; out as paged_attention.
// Graph-safe like paged_attention (the launch shape depends on num_seqs and the head shape).
struct RopeCacheAttentionArgs {
    // The attention's arguments as paged_attention takes them, except: attn.q is not read (q
    // comes rotated from qkv), no workspace is needed, and the caches are also written (at the
    // new slot). attn.batch.slot_mapping is read.
    AttentionArgs attn;
    const bf16_t* qkv = nullptr;      // [num_seqs, (num_heads + 2 num_kv_heads) * head_dim]
    const float* inv_freq = nullptr;  // [rotary_dim / 2] f32
    int rotary_dim = 0;
    float attention_factor = 1.0f;
    bool neox = true;
};
// Whether rope_cache_attention takes this batch and shape: every sequence one query token
// (num_tokens == num_seqs, max_query_len == 1), 1..4 sequences, head_dim 64 / 128 / 256,
// num_heads a multiple of num_kv_heads with few enough (sequence, kv head) units that the
// attention's splits merge in a thread-block cluster, rotary_dim even and <= head_dim, block_size
// a power of two, qkv and the caches 16-byte aligned, bf16 caches (not k_fp8), and the attention
// kernel choice Auto.
// Otherwise run rope_and_cache_packed and paged_attention.
bool rope_cache_attention_supported(const RopeCacheAttentionArgs& args);
void rope_cache_attention(const RopeCacheAttentionArgs& args, cudaStream_t stream);

// ---- sampling ------------------------------------------------------------------------------
// One row's sampling parameters as the kernels read them from device memory (CudaSampler packs
// them from the engine's SampleRow), in vLLM's order: penalties, temperature, top-k, top-p, min-p.
struct SamplingRow {
    float temperature = 0.0f;  // is_greedy (backend/sampling_row.h): argmax, lowest id on ties
    int32_t top_k = 0;         // <= 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off
    float repetition_penalty = 1.0f;
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    uint64_t seed = 0;          // Philox key: the request's seed (or a per-request random one)
    uint64_t offset = 0;        // Philox counter: the number of tokens this sequence sampled before
    int32_t num_logprobs = -1;  // -1: none; k >= 0: sampled token's raw logprob + top k (k <= 20)

    // The rules every sampler shares (the CPU one too), used by the host (which picks the
    // greedy fast path and sends the penalty lists) and by the kernels.
    constexpr bool greedy() const { return is_greedy(temperature, top_k); }
    constexpr bool penalised() const { return is_penalised(repetition_penalty, presence_penalty, frequency_penalty); }
};

// Penalty inputs of row r: tokens pen_tokens[pen_offsets[r] .. pen_offsets[r+1]) with their
// output counts pen_counts (0 for a token seen only in the prompt: repetition penalty only).
struct PenaltyArgs {
    const int32_t* offsets = nullptr;  // [n + 1]; nullptr: no penalties in this batch
    const int32_t* tokens = nullptr;
    const int32_t* counts = nullptr;
};

constexpr int kMaxSampleLogprobs = 20;

// logits: [n, vocab] f32, modified in place (penalties, temperature). Writes out_tokens[n];
// when any row asked for logprobs: out_logprob[n] (raw log-softmax of the chosen token),
// top_ids / top_logprobs [n, kMaxSampleLogprobs] (raw, descending). `workspace` holds at
// least sample_workspace_bytes(n, vocab) bytes.
size_t sample_workspace_bytes(int n, int vocab);
void sample(float* logits, int n, int vocab, const SamplingRow* rows, const PenaltyArgs& penalties, int32_t* out_tokens,
            float* out_logprob, int32_t* top_ids, float* top_logprobs, void* workspace, cudaStream_t stream);
// The greedy rows' fast path (no penalties, no logprobs): out_tokens[r] = the argmax of
// logits row r (lowest id on ties, NaN never chosen; 0 for a row of NaN), as sample() picks
// for a greedy row, spread over many CTAs per row. workspace: sample_workspace_bytes(n, vocab).
// out_host (may be null): the device address of pinned host memory that receives the tokens
// too, written by the kernel itself (no copy to wait for after it).
void greedy_argmax(const float* logits, int n, int vocab, int32_t* out_tokens, int32_t* out_host, void* workspace,
                   cudaStream_t stream);
// Structured output: for each of m constrained rows, logits[rows[i], t] = -inf where bit t of
// masks[i] ([m, words] u32, bit t of word t / 32) is clear; ids past words * 32 too.
void apply_token_masks(float* logits, int vocab, const uint32_t* masks, const int32_t* rows, int m, int words,
                       cudaStream_t stream);

}  // namespace peregrine::cuda
