#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/backend_helpers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_gguf.h"
#include "backend/cuda/cuda_sampler.h"
#include "core/env.h"
#include "core/half.h"
#include "core/kv_fp8.h"
#include "core/quant.h"

namespace peregrine {

namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's split-K / stream-K scratch
constexpr size_t kStageBytes = size_t{64} << 20;        // pinned staging for weight uploads
constexpr int kScratchInts = 1 << 16;                   // ids / rows / block pairs outside a step

// A layer's K and V caches, bf16 or FP8 (core/kv_fp8.h), for num_kv heads of head_dim; true for FP8.
bool check_caches(const Tensor& k_cache, const Tensor& v_cache, int64_t num_kv, int64_t head_dim) {
    const bool fp8 = k_cache.dtype == DType::F8_E4M3;
    PG_CHECK(k_cache.dtype == v_cache.dtype && k_cache.shape == v_cache.shape && k_cache.device == Device::CUDA &&
                 (fp8 || k_cache.dtype == DType::BF16) && k_cache.ndim == 4 && k_cache.dim(2) == num_kv &&
                 k_cache.cols() == (fp8 ? kv_fp8_cols(head_dim) : head_dim),
             "CUDA backend: KV caches ", dtype_name(k_cache.dtype), " ", k_cache.shape_str(), " / ",
             dtype_name(v_cache.dtype), " ", v_cache.shape_str(), " for ", num_kv, " kv heads of ", head_dim);
    return fp8;
}

// The padded decode sizes that get a CUDA graph each (vLLM's buckets: 1, 2, 4, then steps of 8).
int bucket_for(int n) {
    if (n <= 1) return 1;
    if (n <= 2) return 2;
    if (n <= 4) return 4;
    if (n <= 8) return 8;
    if (n <= 64) return (n + 7) / 8 * 8;
    return (n + 15) / 16 * 16;
}

}  // namespace

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

bool cuda_device_available() {
    return cuda_device_count() > 0;
}

struct CudaBackend::Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ~Graph() {
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
    }
};

CudaBackend::CudaBackend(const CudaOptions& options) : options_(options) {
    if (!cuda_device_available()) fail("--device cuda: no CUDA device found");
    PG_CUDA_CHECK(cudaSetDevice(options_.device));
    cudaDeviceProp prop{};
    PG_CUDA_CHECK(cudaGetDeviceProperties(&prop, options_.device));
    sm_count_ = prop.multiProcessorCount;
    device_name_ = prop.name;
    if (prop.major < 9)
        fail("--device cuda: ", device_name_, " is compute capability ", prop.major, ".", prop.minor,
             "; this build has kernels for sm_90a (Hopper) only");
    fp8_outer_vectors_ = options_.fp8_outer_vectors;
    if (options_.fp8_lm_head && !options_.fp8_weights)
        fail("--fp8-lm-head quantizes the LM head with the layers: it needs --quantization fp8");
    if (options_.fp8_weights && options_.batch_invariant)
        fail("--quantization fp8 with --batch-invariant: the batch-invariant products are bf16 only; drop one");
    PG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cublasLtHandle_t h = nullptr;
    PG_LT_CHECK(cublasLtCreate(&h));
    lt_ = h;
    lt_workspace_bytes_ = kLtWorkspaceBytes;
    PG_CUDA_CHECK(cudaMalloc(&lt_workspace_, lt_workspace_bytes_));
    PG_CUDA_CHECK(cudaMalloc(&scratch_ints_, kScratchInts * sizeof(int32_t)));
    PG_CUDA_CHECK(cudaMallocHost(&scratch_host_, kScratchInts * sizeof(int32_t)));
    for (cudaEvent_t& e : meta_copied_) PG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CudaBackend::~CudaBackend() {
    scratch_.clear();
    for (Tensor* t : {&f8_input_, &f8_scale_, &f8_product_, &gguf_scratch_})
        if (!t->empty()) release(*t);
    cudaStreamSynchronize(stream_);
    graphs_.clear();
    gemms_.clear();
    for (void* p : owned_) cudaFree(p);
    cudaFree(meta_dev_);
    for (int32_t* h : meta_host_) cudaFreeHost(h);
    for (cudaEvent_t e : meta_copied_) cudaEventDestroy(e);
    cudaFree(scratch_ints_);
    cudaFreeHost(scratch_host_);
    cudaFree(attn_ws_);
    cudaFree(lt_workspace_);
    if (stage_) cudaFreeHost(stage_);
    if (lt_) cublasLtDestroy(lt_handle(lt_));
    if (copy_stream_) {
        cudaStreamSynchronize(copy_stream_);
        cudaFree(host_copy_list_);
        cudaStreamDestroy(copy_stream_);
        cudaEventDestroy(copy_ready_);
        cudaEventDestroy(copy_done_);
        for (cudaEvent_t e : cache_events_) cudaEventDestroy(e);
    }
    if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
    const char* fp8 = options_.fp8_lm_head ? ", FP8 layers and LM head" : options_.fp8_weights ? ", FP8 layers" : "";
    return "cuda (" + device_name_ + ", " + std::to_string(sm_count_) + " SMs, bf16" + fp8 + ", cuBLASLt" +
           (options_.graphs ? ", CUDA graphs)" : ", eager)");
}

void CudaBackend::make_current() {
    int current = -1;
    PG_CUDA_CHECK(cudaGetDevice(&current));  // the runtime's per-thread state: no driver call
    if (current != options_.device) PG_CUDA_CHECK(cudaSetDevice(options_.device));
}

void CudaBackend::synchronize() {
    await_all_caches();
    PG_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool CudaBackend::memory_info(size_t& free_bytes, size_t& total_bytes) const {
    PG_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return true;
}

bool CudaBackend::capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    PG_CUDA_CHECK(cudaStreamIsCapturing(stream_, &st));
    return st != cudaStreamCaptureStatusNone;
}

// ---- memory ---------------------------------------------------------------------------------

Tensor CudaBackend::allocate(DType dtype, std::initializer_list<int64_t> shape) {
    PG_CHECK(!capturing(), "CUDA backend: allocation while recording a graph");
    Tensor t(nullptr, dtype, shape, Device::CUDA);
    const size_t bytes = std::max<size_t>(t.nbytes(), 1);
    const cudaError_t e = cudaMalloc(&t.data, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        fail("CUDA backend: cannot allocate ", bytes, " bytes for a ", dtype_name(dtype), " ", t.shape_str(),
             " tensor (", free_b >> 20, " MiB free of ", total_b >> 20, " MiB): ", cudaGetErrorString(e));
    }
    return t;
}

void CudaBackend::release(Tensor& t) {
    if (t.data) {
        PG_CUDA_CHECK(cudaStreamSynchronize(stream_));
        PG_CUDA_CHECK(cudaFree(t.data));
    }
    t = Tensor();
}

void CudaBackend::upload(const void* src, const Tensor& dst) {
    await_all_caches();  // dst may be a cache a tier copy still writes
    PG_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    synchronize();
}

void CudaBackend::download(const Tensor& src, void* dst) {
    await_all_caches();  // src may be a cache a tier copy still writes
    PG_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    synchronize();
}

bool CudaBackend::supports_weight_dtype(DType t) const {
    // Every stored type is read by place_weight, which converts matrices to bf16 row by row;
    // f8_e4m3 layer matrices (FP8 checkpoints) stay FP8 where keeps_fp8 allows.
    return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F8_E4M3 ||
           (dtype_is_quantized(t) && !dtype_is_gpu_layout(t));
}

bool CudaBackend::keeps_fp8(const std::vector<Tensor>& parts) const {
    // The FP8 products need k % 16 == 0 (16-byte loads, cuBLASLt FP8) and are not batch-invariant.
    if (options_.batch_invariant) return false;
    for (const Tensor& p : parts)
        if (p.device != Device::CPU || p.dtype != DType::F8_E4M3 || p.scale == nullptr || p.ndim != 2 ||
            p.cols() % 16 != 0 || p.cols() != parts[0].cols())
            return false;
    return true;
}

Tensor CudaBackend::allocate_fp8_weight(int64_t rows, int64_t cols) {
    Tensor w(nullptr, DType::F8_E4M3, {rows, cols}, Device::CUDA);
    allocate_weight(w);
    Tensor factors(nullptr, DType::F32, {rows}, Device::CUDA);
    allocate_weight(factors);
    w.scale = factors.ptr<float>();
    return w;
}

Tensor CudaBackend::place_fp8(const std::vector<Tensor>& parts) {
    int64_t rows = 0;
    for (const Tensor& p : parts) rows += p.rows();
    const int64_t cols = parts[0].cols();
    Tensor dev = allocate_fp8_weight(rows, cols);
    // Parts stack their rows (codes [rows_i, cols] bytes, contiguous on the host) and factors.
    int64_t r0 = 0;
    for (const Tensor& p : parts) {
        PG_CUDA_CHECK(
            cudaMemcpyAsync(dev.ptr<uint8_t>() + r0 * cols, p.data, p.nbytes(), cudaMemcpyHostToDevice, stream_));
        PG_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(dev.scale) + r0, p.scale, p.rows() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_));
        r0 += p.rows();
    }
    synchronize();  // the host views may be unmapped after placement
    return dev;
}

void CudaBackend::ensure_stage() {
    if (stage_) return;
    stage_bytes_ = kStageBytes;
    PG_CUDA_CHECK(cudaMallocHost(&stage_, stage_bytes_));
}

void CudaBackend::convert_rows_into(const Tensor& host, DType out_type, void* dst_dev) {
    ensure_stage();
    // Convert whole rows into the pinned stage, then copy each filled stage out.
    const int64_t rows = host.rows(), cols = host.cols();
    const size_t out_row = dtype_row_bytes(out_type, cols);
    PG_CHECK(out_row <= stage_bytes_, "weight row too long for the staging buffer");
    std::vector<float> f32(static_cast<size_t>(cols));
    const int64_t rows_per_stage = static_cast<int64_t>(stage_bytes_ / out_row);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_stage) {
        const int64_t r1 = std::min(rows, r0 + rows_per_stage);
        for (int64_t r = r0; r < r1; ++r) {
            char* dst = static_cast<char*>(stage_) + (r - r0) * out_row;
            if (host.dtype == out_type) {
                std::memcpy(dst, host.row(r), out_row);
                continue;
            }
            dequantize_tensor_row(host, r, f32.data());  // f8_e4m3: with its row factor
            if (out_type == DType::F32) {
                std::memcpy(dst, f32.data(), out_row);
            } else {
                auto* o = reinterpret_cast<uint16_t*>(dst);
                for (int64_t c = 0; c < cols; ++c) o[c] = f32_to_bf16(f32[c]);
            }
        }
        PG_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst_dev) + r0 * out_row, stage_, (r1 - r0) * out_row,
                                      cudaMemcpyHostToDevice, stream_));
        synchronize();  // the stage is refilled next
    }
}

void CudaBackend::allocate_weight(Tensor& t) {
    PG_CUDA_CHECK(cudaMalloc(&t.data, std::max<size_t>(t.nbytes(), 1)));
    owned_.push_back(t.data);
    weight_bytes_ += t.nbytes();
}

Tensor CudaBackend::place_weight(const Tensor& host, bool matrix) {
    if (host.device == Device::CUDA) return host;
    if (auto it = placed_.find(host.data); it != placed_.end()) return it->second;
    if (matrix && keeps_fp8({host})) return placed_[host.data] = place_fp8({host});
    Tensor dev(nullptr, matrix ? DType::BF16 : DType::F32, {}, Device::CUDA);
    dev.ndim = host.ndim;
    dev.shape = host.shape;
    allocate_weight(dev);
    convert_rows_into(host, dev.dtype, dev.data);
    placed_[host.data] = dev;
    return dev;
}

Tensor CudaBackend::place_stacked(const std::vector<Tensor>& parts, bool matrix) {
    PG_CHECK(!parts.empty());
    if (matrix && keeps_fp8(parts)) return place_fp8(parts);
    // Matrices stack rows; vectors (biases) concatenate.
    const bool vectors = parts[0].ndim == 1;
    int64_t rows = 0;
    for (const Tensor& p : parts) {
        PG_CHECK(vectors ? p.ndim == 1 : p.cols() == parts[0].cols(), "place_stacked: parts differ in shape");
        rows += vectors ? p.numel() : p.rows();
    }
    const DType type = matrix ? DType::BF16 : DType::F32;
    Tensor dev = vectors ? Tensor(nullptr, type, {rows}, Device::CUDA)
                         : Tensor(nullptr, type, {rows, parts[0].cols()}, Device::CUDA);
    allocate_weight(dev);
    char* at = static_cast<char*>(dev.data);
    for (const Tensor& p : parts) {
        const size_t bytes = static_cast<size_t>(p.rows()) * dtype_row_bytes(type, p.cols());
        if (p.device == Device::CUDA) {
            PG_CHECK(p.dtype == type, "place_stacked: device part of dtype ", dtype_name(p.dtype));
            PG_CUDA_CHECK(cudaMemcpyAsync(at, p.data, bytes, cudaMemcpyDeviceToDevice, stream_));
        } else {
            convert_rows_into(p, type, at);
        }
        at += bytes;
    }
    synchronize();
    return dev;
}

Tensor CudaBackend::place_lm_head(const Tensor& host) {
    const Tensor head = place_layer_matrix({host});
    return options_.fp8_lm_head ? quantize_weight(head) : head;
}

Tensor CudaBackend::place_tied_head(const Tensor& placed_embedding) {
    return options_.fp8_lm_head ? quantize_weight(placed_embedding, /*keep=*/true) : placed_embedding;
}

Tensor CudaBackend::quantize_weight(const Tensor& w, bool keep) {
    if (w.empty() || w.dtype != DType::BF16 || w.ndim != 2 || w.cols() % 16 != 0) return w;
    const int64_t rows = w.rows(), cols = w.cols();
    Tensor q = allocate_fp8_weight(rows, cols);
    cuda::quantize_rows_e4m3(bf(w), q.ptr<uint8_t>(), const_cast<float*>(q.scale), rows, cols, stream_);
    // The bf16 matrix goes where this backend made it (stacked or converted from the host); a
    // device tensor handed in (dummy weights) belongs to its loader.
    if (auto it = std::find(owned_.begin(), owned_.end(), w.data); !keep && it != owned_.end()) {
        synchronize();
        PG_CUDA_CHECK(cudaFree(w.data));
        owned_.erase(it);
        weight_bytes_ -= w.nbytes();
        std::erase_if(placed_, [&](const auto& kv) { return kv.second.data == w.data; });
    }
    return q;
}

void CudaBackend::fill_random(const Tensor& t, uint64_t seed, float lo, float hi) {
    if (t.dtype == DType::BF16) {
        // Symmetric ranges only for bf16 (weights); shift by the centre otherwise.
        PG_CHECK(lo == -hi, "fill_random: bf16 ranges must be symmetric");
        cuda::fill_random_bf16(bf(t), t.numel(), seed, hi, stream_);
    } else if (t.dtype == DType::F32) {
        cuda::fill_random_f32(t.ptr<float>(), t.numel(), seed, lo, hi, stream_);
    } else {
        fail("fill_random: unsupported dtype ", dtype_name(t.dtype));
    }
}

// ---- step metadata ----------------------------------------------------------------------------

void CudaBackend::ensure_meta(int tokens, int seqs, int stride) {
    if (tokens <= tok_cap_ && seqs <= seq_cap_ && stride <= stride_cap_) return;
    PG_CHECK(!capturing(), "CUDA backend: batch grew while recording a graph");
    synchronize();
    clear_graphs();  // recordings hold the old buffers' addresses
    tok_cap_ = std::max({tokens, tok_cap_, 256});
    seq_cap_ = std::max({seqs, seq_cap_, 256});
    stride_cap_ = std::max({stride, stride_cap_, 64});
    if (meta_dev_) cudaFree(meta_dev_);
    for (int32_t*& h : meta_host_)
        if (h) cudaFreeHost(h);
    meta_ints_ = static_cast<size_t>(tok_cap_ + 3) * 4 + 2 * static_cast<size_t>(seq_cap_ + 4) +
                 static_cast<size_t>(seq_cap_) * stride_cap_;  // begin_step's layout, 16-byte aligned
    PG_CUDA_CHECK(cudaMalloc(&meta_dev_, meta_ints_ * sizeof(int32_t)));
    for (int32_t*& h : meta_host_) PG_CUDA_CHECK(cudaMallocHost(&h, meta_ints_ * sizeof(int32_t)));
}

void CudaBackend::set_token_feed(const int32_t* feed, int rows) {
    PG_CHECK(!capturing(), "CUDA backend: token feed changed while recording a graph");
    if (feed == feed_ && rows == feed_rows_) return;
    clear_graphs();
    feed_ = feed;
    feed_rows_ = rows;
}

void CudaBackend::begin_step(const BatchInput& b) {
    const int n = b.num_tokens(), s = b.num_seqs();
    scratch_.reserve(n, std::max<int64_t>(static_cast<int64_t>(b.logits_indices.size()), 1));
    ensure_meta(n, s, b.max_blocks_per_seq);
    for (int32_t id : b.token_ids)
        PG_CHECK(id >= -feed_rows_, "CUDA backend: token id ", id, " is neither a token nor one of ", feed_rows_,
                 " fed draws");
    // This twin's last copy (two steps ago) must be done before it is overwritten; the other
    // twin may still be queued behind a running step.
    meta_turn_ ^= 1;
    PG_CUDA_CHECK(cudaEventSynchronize(meta_copied_[meta_turn_]));
    // The step's regions lie back to back at 16-byte boundaries, so one copy moves them: token
    // ids, positions, slots, logits rows [n each], query_start [s + 1], context_lens [s], block
    // tables [s, stride_cap]. The layout depends only on (n, s): a decode graph, recorded for its
    // bucket's padded size, finds every later step of that bucket where it recorded the first.
    auto up4 = [](int x) { return (x + 3) / 4 * 4; };
    const int nt = up4(n), ns = up4(s + 1);
    const size_t o_pos = nt, o_slot = 2 * nt, o_lidx = 3 * nt, o_qs = 4 * nt, o_ctx = o_qs + ns, o_tab = o_ctx + ns;
    const size_t total = o_tab + static_cast<size_t>(s) * stride_cap_;
    PG_CHECK(total <= meta_ints_ && static_cast<int>(b.logits_indices.size()) <= n);
    int32_t* h = meta_host_[meta_turn_];
    std::copy(b.token_ids.begin(), b.token_ids.end(), h);
    std::copy(b.positions.begin(), b.positions.end(), h + o_pos);
    std::copy(b.slot_mapping.begin(), b.slot_mapping.end(), h + o_slot);
    std::copy(b.logits_indices.begin(), b.logits_indices.end(), h + o_lidx);
    std::copy(b.query_start.begin(), b.query_start.end(), h + o_qs);
    std::copy(b.context_lens.begin(), b.context_lens.end(), h + o_ctx);
    int max_q = 0, max_ctx = 0;
    for (int i = 0; i < s; ++i) {
        max_q = std::max(max_q, b.query_start[i + 1] - b.query_start[i]);
        max_ctx = std::max(max_ctx, b.context_lens[i]);
        // Re-stride the block table to the fixed capacity (graph recordings keep the stride).
        const int32_t* src = b.block_tables.data() + static_cast<size_t>(i) * b.max_blocks_per_seq;
        int32_t* dst = h + o_tab + static_cast<size_t>(i) * stride_cap_;
        std::copy(src, src + b.max_blocks_per_seq, dst);
        std::fill(dst + b.max_blocks_per_seq, dst + stride_cap_, -1);
    }
    PG_CUDA_CHECK(cudaMemcpyAsync(meta_dev_, h, total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    PG_CUDA_CHECK(cudaEventRecord(meta_copied_[meta_turn_], stream_));

    int32_t* d = meta_dev_;
    dbatch_.num_tokens = n;
    dbatch_.num_seqs = s;
    dbatch_.block_stride = stride_cap_;
    dbatch_.max_query_len = max_q;
    dbatch_.max_context_len = max_ctx;
    dbatch_.token_ids = d;
    dbatch_.positions = d + o_pos;
    dbatch_.slot_mapping = d + o_slot;
    d_logits_indices_ = d + o_lidx;
    dbatch_.query_start = d + o_qs;
    dbatch_.context_lens = d + o_ctx;
    dbatch_.block_tables = d + o_tab;
    step_ = &b;
}

int CudaBackend::step_bucket(int num_seqs) const {
    if (!options_.graphs || num_seqs > options_.max_graph_batch) return -1;
    return std::min(bucket_for(num_seqs), options_.max_graph_batch);
}

void CudaBackend::clear_graphs() {
    graphs_.clear();
}

void CudaBackend::run_step(int key, const std::function<void()>& ops) {
    if (key < 0 || !options_.graphs) {
        ops();
        return;
    }
    await_all_caches();  // a graph's kernels touch the caches without asking
    // Steps of one bucket differ in shape only by the decode attention's context class.
    key = 2 * key + cuda::short_decode_class(dbatch_.num_seqs, dbatch_.max_context_len);
    if (auto it = graphs_.find(key); it != graphs_.end()) {
        PG_CUDA_CHECK(cudaGraphLaunch(it->second->exec, stream_));
        return;
    }
    // First step of this size: run it eagerly (cuBLASLt plans, workspaces and the rope table
    // are set up outside the recording), then record the same ops for later steps. Running
    // them twice is harmless: each op rewrites its outputs, and the cache writes are the same.
    ops();
    auto g = std::make_unique<Graph>();
    PG_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
        ops();
    } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream_, &broken);
        if (broken) cudaGraphDestroy(broken);
        throw;
    }
    PG_CUDA_CHECK(cudaStreamEndCapture(stream_, &g->graph));
    PG_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    graphs_[key] = std::move(g);
}

const int32_t* CudaBackend::device_ints(const int32_t* host, int64_t n, int32_t* scratch) {
    PG_CHECK(n <= kScratchInts, "CUDA backend: ", n, " ids exceed the scratch buffer");
    PG_CHECK(!capturing(), "CUDA backend: host ids while recording a graph");
    synchronize();  // the pinned scratch may still be in flight
    std::memcpy(scratch_host_, host, n * sizeof(int32_t));
    PG_CUDA_CHECK(cudaMemcpyAsync(scratch, scratch_host_, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    return scratch;
}

// ---- ops ---------------------------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, const int32_t* ids, int64_t n, const Tensor& out,
                            int32_t vocab_begin) {
    PG_CHECK(out.dtype == DType::F32);
    const int32_t* d_ids =
        (step_ && ids == step_->token_ids.data()) ? dbatch_.token_ids : device_ints(ids, n, scratch_ints_);
    if (dtype_is_gpu_layout(table.dtype))
        cuda::gguf_embedding(gguf_gemv_weight(table), d_ids, feed_, static_cast<int>(n), static_cast<int>(table.cols()),
                             vocab_begin, static_cast<int>(table.rows()), out.ptr<float>(), stream_);
    else
        cuda::embedding(bf(table), d_ids, feed_, static_cast<int>(n), static_cast<int>(table.cols()), vocab_begin,
                        static_cast<int>(table.rows()), out.ptr<float>(), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                           const Tensor& out) {
    PG_CHECK(weight.dtype == DType::F32 && (residual.empty() || residual.dtype == DType::F32));
    cuda::rms_norm(x.data, x.dtype == DType::F32, residual.empty() ? nullptr : residual.ptr<float>(),
                   weight.ptr<float>(), eps, out.data, out.dtype == DType::F32, static_cast<int>(x.rows()),
                   static_cast<int>(x.cols()), stream_);
}

void CudaBackend::add(const Tensor& x, const Tensor& out) {
    PG_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32 && x.numel() == out.numel(), "add: ", x.shape_str(),
             " to ", out.shape_str());
    cuda::add_f32(x.ptr<float>(), out.ptr<float>(), x.numel(), stream_);
}

void CudaBackend::rope_and_cache(const Tensor& q, const Tensor& k, const Tensor& v, const BatchInput& batch,
                                 const RopeTable& rope, int head_dim, const Tensor& k_cache, const Tensor& v_cache) {
    PG_CHECK(&batch == step_, "CUDA backend: rope_and_cache outside the step given to begin_step");
    await_cache(k_cache);
    await_cache(v_cache);
    const float* inv_freq = rope_inv_freq(rope);
    const int num_heads = static_cast<int>(q.cols() / head_dim), num_kv = static_cast<int>(k.cols() / head_dim);
    const bool fp8 = check_caches(k_cache, v_cache, num_kv, head_dim);
    cuda::DeviceBatch db = dbatch_;
    db.block_size = static_cast<int>(k_cache.dim(1));
    if (fp8)
        cuda::rope_and_cache_fp8(bf(q), bf(k), bf(v), db, inv_freq, rope.rotary_dim, rope.attention_factor,
                                 rope.style == RopeStyle::Neox, num_heads, num_kv, head_dim, k_cache.ptr<uint8_t>(),
                                 v_cache.ptr<uint8_t>(), stream_);
    else
        cuda::rope_and_cache(bf(q), bf(k), bf(v), db, inv_freq, rope.rotary_dim, rope.attention_factor,
                             rope.style == RopeStyle::Neox, num_heads, num_kv, head_dim, bf(k_cache), bf(v_cache),
                             stream_);
}

const float* CudaBackend::rope_inv_freq(const RopeTable& rope) {
    if (const auto it = placed_.find(rope.inv_freq.data()); it != placed_.end()) return it->second.ptr<float>();
    PG_CHECK(!capturing(), "CUDA backend: rope table first seen while recording a graph");
    Tensor host(const_cast<float*>(rope.inv_freq.data()), DType::F32, {static_cast<int64_t>(rope.inv_freq.size())});
    return place_weight(host, false).ptr<float>();
}

void CudaBackend::rope_and_cache_packed(const Tensor& qkv, const Tensor& q_out, const BatchInput& batch,
                                        const RopeTable& rope, int head_dim, int num_kv_heads, const Tensor& k_cache,
                                        const Tensor& v_cache) {
    PG_CHECK(&batch == step_, "CUDA backend: rope_and_cache_packed outside the step given to begin_step");
    await_cache(k_cache);
    await_cache(v_cache);
    const int num_heads = static_cast<int>(q_out.cols() / head_dim);
    PG_CHECK(qkv.cols() == static_cast<int64_t>(num_heads + 2 * num_kv_heads) * head_dim);
    const bool fp8 = check_caches(k_cache, v_cache, num_kv_heads, head_dim);
    cuda::DeviceBatch db = dbatch_;
    db.block_size = static_cast<int>(k_cache.dim(1));
    if (fp8)
        cuda::rope_and_cache_packed_fp8(bf(qkv), bf(q_out), db, rope_inv_freq(rope), rope.rotary_dim,
                                        rope.attention_factor, rope.style == RopeStyle::Neox, num_heads, num_kv_heads,
                                        head_dim, k_cache.ptr<uint8_t>(), v_cache.ptr<uint8_t>(), stream_);
    else
        cuda::rope_and_cache_packed(bf(qkv), bf(q_out), db, rope_inv_freq(rope), rope.rotary_dim, rope.attention_factor,
                                    rope.style == RopeStyle::Neox, num_heads, num_kv_heads, head_dim, bf(k_cache),
                                    bf(v_cache), stream_);
}

cuda::AttentionArgs CudaBackend::attention_args(const Tensor& k_cache, const Tensor& v_cache, int num_heads,
                                                int head_dim, float scale, int window, const Tensor& out) const {
    cuda::AttentionArgs a;
    if (check_caches(k_cache, v_cache, k_cache.dim(2), head_dim)) {
        a.k_fp8 = k_cache.ptr<uint8_t>();
        a.v_fp8 = v_cache.ptr<uint8_t>();
    } else {
        a.k_cache = bf(k_cache);
        a.v_cache = bf(v_cache);
    }
    a.out = bf(out);
    a.batch = dbatch_;
    a.batch.block_size = static_cast<int>(k_cache.dim(1));
    a.num_heads = num_heads;
    a.num_kv_heads = static_cast<int>(k_cache.dim(2));
    a.head_dim = head_dim;
    a.scale = scale;
    a.window = window;
    return a;
}

void CudaBackend::rope_cache_attention(const Tensor& qkv, const Tensor& q, const BatchInput& batch,
                                       const RopeTable& rope, int head_dim, int num_kv_heads, const Tensor& k_cache,
                                       const Tensor& v_cache, int num_heads, float scale, int window,
                                       const Tensor& out) {
    PG_CHECK(&batch == step_, "CUDA backend: rope_cache_attention outside the step given to begin_step");
    await_cache(k_cache);
    await_cache(v_cache);
    PG_CHECK(qkv.cols() == static_cast<int64_t>(num_heads + 2 * num_kv_heads) * head_dim);
    check_caches(k_cache, v_cache, num_kv_heads, head_dim);
    cuda::RopeCacheAttentionArgs a;
    a.attn = attention_args(k_cache, v_cache, num_heads, head_dim, scale, window, out);
    a.qkv = bf(qkv);
    a.rotary_dim = rope.rotary_dim;
    a.attention_factor = rope.attention_factor;
    a.neox = rope.style == RopeStyle::Neox;
    // (The choice depends only on the batch's shape, fixed for a recorded decode bucket.)
    if (options_.batch_invariant || !cuda::rope_cache_attention_supported(a)) {
        rope_and_cache_packed(qkv, q, batch, rope, head_dim, num_kv_heads, k_cache, v_cache);
        attention(q, k_cache, v_cache, batch, num_heads, head_dim, scale, window, out);
        return;
    }
    a.inv_freq = rope_inv_freq(rope);
    cuda::rope_cache_attention(a, stream_);
}

void CudaBackend::silu_mul_packed(const Tensor& gate_up, const Tensor& out) {
    PG_CHECK(gate_up.cols() == 2 * out.cols() && gate_up.rows() == out.rows());
    cuda::silu_mul_packed(bf(gate_up), bf(out), out.rows(), out.cols(), stream_);
}

void CudaBackend::ensure_attention_workspace(size_t bytes) {
    if (bytes <= attn_ws_bytes_) return;
    PG_CHECK(!capturing(), "CUDA backend: attention workspace grew while recording a graph");
    synchronize();
    if (attn_ws_) cudaFree(attn_ws_);
    PG_CUDA_CHECK(cudaMalloc(&attn_ws_, bytes));
    attn_ws_bytes_ = bytes;
}

void CudaBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const BatchInput& batch,
                            int num_heads, int head_dim, float scale, int window, const Tensor& out) {
    PG_CHECK(&batch == step_, "CUDA backend: attention outside the step given to begin_step");
    await_cache(k_cache);
    await_cache(v_cache);
    // Sized for the metadata capacity, so every batch up to it (and its recordings) fits.
    ensure_attention_workspace(
        cuda::attention_workspace_bytes(tok_cap_, num_heads, head_dim, options_.batch_invariant));
    cuda::AttentionArgs a = attention_args(k_cache, v_cache, num_heads, head_dim, scale, window, out);
    a.q = bf(q);
    a.workspace = attn_ws_;
    a.workspace_bytes = attn_ws_bytes_;
    a.batch_invariant = options_.batch_invariant;
    cuda::paged_attention(a, stream_);
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
    cuda::silu_mul(bf(gate), bf(up), bf(out), gate.rows(), gate.cols(), stream_);
}

// A strided device-to-device copy: capturable in a step's graph.
void CudaBackend::copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t rows,
                               int64_t cols) {
    PG_CHECK(src.dtype == dst.dtype && src_col + cols <= src.cols() && dst_col + cols <= dst.cols() &&
             rows <= src.rows() && rows <= dst.rows());
    if (rows == 0 || cols == 0) return;
    const size_t es = dtype_row_bytes(src.dtype, 1);
    PG_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data) + dst_col * es, dst.cols() * es,
                                    static_cast<const char*>(src.data) + src_col * es, src.cols() * es, cols * es, rows,
                                    cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::copy_blocks(const Tensor& cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    await_cache(cache);
    // In 2-byte units: bf16 values, or an FP8 block's bytes (even: codes and 2-byte scales).
    const int64_t block_elems = static_cast<int64_t>(cache.nbytes() / static_cast<size_t>(cache.dim(0)) / 2);
    for (size_t i = 0; i < pairs.size();) {
        const size_t chunk = std::min(pairs.size() - i, static_cast<size_t>(kScratchInts / 2));
        std::vector<int32_t> flat(2 * chunk);
        for (size_t j = 0; j < chunk; ++j) {
            flat[2 * j] = pairs[i + j].first;
            flat[2 * j + 1] = pairs[i + j].second;
        }
        const int32_t* d = device_ints(flat.data(), static_cast<int64_t>(flat.size()), scratch_ints_);
        cuda::copy_blocks(bf(cache), d, static_cast<int>(chunk), block_elems, stream_);
        i += chunk;
    }
}

void CudaBackend::gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& out) {
    const int32_t* d_rows = (step_ && &rows == &step_->logits_indices)
                                ? d_logits_indices_
                                : device_ints(rows.data(), static_cast<int64_t>(rows.size()), scratch_ints_);
    cuda::gather_rows(bf(x), d_rows, static_cast<int>(rows.size()), static_cast<int>(x.cols()), bf(out), stream_);
}

std::unique_ptr<DeviceSampler> CudaBackend::make_sampler(int max_rows, int vocab) {
    return std::make_unique<CudaSampler>(*this, max_rows, vocab);
}

}  // namespace peregrine
