#include "worker/worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/kv_cache.h"
#include "model/registry.h"
#ifdef PG_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace peregrine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The backend `device` names: cuda when built with CUDA and a GPU is present for "auto".
std::unique_ptr<Backend> make_backend(const EngineConfig& c, int device_index) {
    // Accepted as vLLM spells it, refused before any weight is read: no backend computes in f16 yet.
    const bool f16 = c.dtype == "float16" || c.dtype == "half";
#ifdef PG_WITH_CUDA
    if (worker_uses_cuda(c)) {
        if (f16)
            fail("--dtype ", c.dtype,
                 ": the CUDA backend has no float16 path (it runs bf16 and f32 weights as they are stored); "
                 "use --dtype auto");
        CudaOptions co;
        co.graphs = !c.enforce_eager;
        co.batch_invariant = c.batch_invariant;
        co.fp8_weights = c.quantization == "fp8";
        co.fp8_lm_head = c.fp8_lm_head;
        co.gguf_quantized = !c.dequantize_gguf;
        co.max_graph_batch = c.max_num_seqs > 0 ? std::min(c.max_num_seqs, 256) : 256;
        // cuda:K picks the GPU of a replica alone; a model-parallel rank gets its place's.
        co.device = device_index > 0 ? device_index : std::max(0, cuda_device_index(c.device));
        return std::make_unique<CudaBackend>(co);
    }
#else
    (void)device_index;
    if (cuda_device_index(c.device) >= 0)
        fail("device ", c.device, ": this build has no CUDA backend (nvcc was not found at build time)");
#endif
    if (f16)
        fail("--dtype ", c.dtype,
             ": the CPU backend has no float16 activation path; use --dtype float32, bfloat16 or auto");
    if (c.quantization != "none")
        fail("--quantization ", c.quantization,
             ": quantization at load runs on the CUDA backend only (the CPU backend runs GGUF quantized types "
             "as stored: load a q8_0 / q4_k GGUF instead)");
    if (c.dequantize_gguf)
        fail("--dequantize-gguf is for the CUDA backend (the CPU backend reads GGUF quantized types as stored)");
    return std::make_unique<CpuBackend>(c.threads, cpu_precision_from_name(c.dtype));
}

// A prefill of `tokens` tokens over `seqs` sequences, each sampling its last token: the
// largest step the scheduler can send, run once to size activations and scratch.
void profile_step(Model& model, Backend& backend, int tokens, int seqs, int block_size) {
    seqs = std::max(1, std::min(seqs, tokens));
    const int per = tokens / seqs;
    BatchInput b;
    b.query_start.push_back(0);
    const int blocks_per_seq = (per + tokens % seqs + block_size - 1) / block_size;
    b.max_blocks_per_seq = blocks_per_seq;
    int next_block = 0;
    for (int s = 0; s < seqs; ++s) {
        const int len = per + (s == seqs - 1 ? tokens % seqs : 0);
        for (int p = 0; p < len; ++p) {
            b.token_ids.push_back(p % 2);
            b.positions.push_back(p);
            b.slot_mapping.push_back((next_block + p / block_size) * block_size + p % block_size);
        }
        for (int i = 0; i < blocks_per_seq; ++i) b.block_tables.push_back(next_block + i);
        next_block += blocks_per_seq;
        b.context_lens.push_back(len);
        b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
        b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
    }
    KvCache cache(backend, model.kv_cache_shape(next_block, block_size));
    std::vector<float> logits;
    model.forward(b, cache, logits);
}

// The weights of the products (q, k, v, o, gate, up, down) in one pipeline stage's layers of `c`
// (a rank's shard: its heads and intermediate rows), the layers per stage rounded up so every
// rank gets the same figure: what a prefill token costs the rank, for the step's token budget.
int64_t stage_product_weights(const ModelConfig& c, int stages) {
    const int64_t h = c.hidden_size;
    const int64_t per_layer = h * (2 * int64_t{c.q_dim()} + 2 * int64_t{c.kv_dim()}) + 3 * h * c.intermediate_size;
    stages = std::max(1, stages);
    return per_layer * ((c.num_layers + stages - 1) / stages);
}

}  // namespace

bool worker_uses_cuda(const EngineConfig& c) {
#ifdef PG_WITH_CUDA
    return cuda_device_index(c.device) >= 0 || (c.device == "auto" && cuda_device_available());
#else
    return cuda_device_index(c.device) >= 0;
#endif
}

int worker_gpu_count() {
#ifdef PG_WITH_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

Worker::Worker(const EngineConfig& config, const WorkerPlace& place)
    : config_(config), place_(place), device_logits_(std::make_unique<Tensor>()) {}

Worker::Worker(Backend& backend, Model& model, int num_blocks, int block_size, DeviceSampler* sampler)
    : backend_(&backend), model_(&model), sampler_(sampler), device_logits_(std::make_unique<Tensor>()) {
    config_.block_size = block_size;
    config_.apply_device_defaults(0);
    init_kv_cache(num_blocks);
}

Worker::~Worker() {
    if (host_kv_) {
        backend_->synchronize();  // no copy may still read or write it
        backend_->free_host(host_kv_);
    }
}

void Worker::init_device() {
    own_backend_ = make_backend(config_, place_.device_index);
    backend_ = own_backend_.get();
    // Before any weight is read: an unsupported --kv-cache-dtype fails at once.
    backend_->set_kv_cache_dtype(kv_cache_dtype_from_name(config_.kv_cache_dtype, backend_->native_kv_cache_dtype()));
    size_t total = 0;
    if (!backend_->memory_info(free_at_init_, total)) free_at_init_ = total = 0;
    config_.apply_device_defaults(total);
}

void Worker::load_model() {
    PG_CHECK(backend_ && !model_, "load_model: call init_device first, once");
    Backend* backend = backend_;
    LoadOptions opt;
    opt.matmul_dtype_ok = [backend](DType t) { return backend->supports_weight_dtype(t); };
    // The bytes read (the loader's last report is (total, total)), for the summary's GB/s.
    size_t read_bytes = 0;
    opt.progress = [&read_bytes, user = place_.verbose ? config_.load_progress : nullptr](size_t done, size_t total) {
        read_bytes = total;
        if (user) user(done, total);
    };
    opt.tp = place_.tp;
    opt.pp = place_.pp;
    const std::string path = config_.model.empty() ? default_model_path() : config_.model;
    const auto t0 = Clock::now();
    loaded_ = config_.load_format == "dummy"
                  ? load_dummy_model(path, *backend_, config_.dummy_seed, 0.02f, place_.tp, place_.pp,
                                     /*lazy_layers=*/true)
                  : peregrine::load_model(path, opt);
    const ModelParallel par = place_.connect ? place_.connect(*backend_) : ModelParallel{};
    own_model_ = create_model(*loaded_, *backend_, par);  // places the weights
    model_ = own_model_.get();
    config_.apply_model_defaults(stage_product_weights(loaded_->config, place_.pp.stages));
    if (!place_.verbose) return;
    const double seconds = seconds_since(t0);
    char rate[64] = "";
    if (read_bytes > 0)
        std::snprintf(rate, sizeof rate, read_bytes >= 1000000000 ? ", %.2f GB at %.2f GB/s" : ", %.2f MB at %.2f GB/s",
                      read_bytes >= 1000000000 ? read_bytes / 1e9 : read_bytes / 1e6, read_bytes / 1e9 / seconds);
    std::fprintf(stderr, "model: %s (%s, %.2fs%s)\n  %s\n  weights: %s\n  backend: %s\n", path.c_str(),
                 loaded_->format.c_str(), seconds, rate, loaded_->config.summary().c_str(),
                 loaded_->weight_dtypes.c_str(), backend_->name().c_str());
    if (!loaded_->quantization.empty()) std::fprintf(stderr, "  quantization: %s\n", loaded_->quantization.c_str());
    if (backend_->device() == Device::CUDA && config_.batch_invariant)
        std::fprintf(stderr, "  batch-invariant kernels (--batch-invariant)\n");
}

int settle_max_model_len(int requested, int model_len, int64_t kv_tokens, size_t bytes_per_token, bool verbose) {
    auto mib = [&](int64_t tokens) {  // "12.50 MiB"
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(tokens) * bytes_per_token / (1 << 20));
        return std::string(buf);
    };
    if (requested > model_len)
        fail("--max-model-len ", requested, " is longer than the model's context (", model_len,
             " tokens, max_position_embeddings); use at most ", model_len);
    if (requested > kv_tokens)
        fail("To serve at least one request with --max-model-len ", requested, ", ", mib(requested),
             " of KV cache is needed, which is larger than the KV cache's ", mib(kv_tokens), " (", kv_tokens,
             " tokens). Based on the available memory, the largest max model length is ", kv_tokens,
             ". Increase --kv-cache-memory (on a GPU: --gpu-memory-utilization) or decrease --max-model-len.");
    if (requested > 0) return requested;
    if (kv_tokens >= model_len) return model_len;
    if (verbose)
        std::fprintf(stderr,
                     "  warning: the KV cache holds %lld tokens, less than the model's context of %d: max_model_len "
                     "lowered to %lld (longer requests get 400). Increase --kv-cache-memory (on a GPU: "
                     "--gpu-memory-utilization) for more, or set --max-model-len.\n",
                     static_cast<long long>(kv_tokens), model_len, static_cast<long long>(kv_tokens));
    return static_cast<int>(kv_tokens);
}

int Worker::determine_kv_blocks() {
    PG_CHECK(model_, "determine_kv_blocks: call load_model first");
    const int block_size = config_.block_size;
    const int64_t per_block = static_cast<int64_t>(model_->kv_cache_shape(1, block_size).bytes_per_block());
    int64_t bytes = config_.kv_cache_memory;
    size_t free_b = 0, total_b = 0;
    if (backend_->memory_info(free_b, total_b)) {
        // A device with memory of its own: weights are in place; one step of the largest size
        // sizes activations and scratch; the KV cache takes what is left of the utilisation target.
        profile_step(*model_, *backend_, config_.max_num_batched_tokens, config_.max_num_seqs, block_size);
        backend_->synchronize();
        backend_->memory_info(free_b, total_b);
        // What this process took since its backend started (weights, activations, scratch):
        // other processes on the GPU (data-parallel replicas sharing it) have their own share.
        const int64_t used = free_at_init_ > free_b ? static_cast<int64_t>(free_at_init_ - free_b)
                                                    : static_cast<int64_t>(total_b - free_b);
        const int64_t budget =
            static_cast<int64_t>(config_.gpu_memory_utilization * static_cast<double>(total_b)) - used;
        std::fprintf(stderr,
                     "  GPU memory: %.2f GiB total, weights %.2f GiB, this process's after profiling %.2f GiB\n",
                     total_b / 1073741824.0, backend_->weight_bytes() / 1073741824.0, used / 1073741824.0);
        if (bytes == 0) {
            if (budget < per_block)
                fail("--gpu-memory-utilization ", config_.gpu_memory_utilization, " leaves no room for the KV cache (",
                     used >> 20, " MiB in use of ", total_b >> 20, " MiB)");
            bytes = budget;
        }
    }
    if (bytes == 0) {
        const int len = config_.max_model_len > 0 ? config_.max_model_len : model_->config().max_position_embeddings;
        const int64_t want =
            static_cast<int64_t>(config_.max_num_seqs) * ((len + block_size - 1) / block_size) * per_block;
        bytes = std::min<int64_t>(want, int64_t{4} << 30);
    }
    const int blocks = static_cast<int>(std::min<int64_t>(bytes / per_block, 1 << 30));
    if (blocks < 1) fail("--kv-cache-memory ", bytes, " is less than one KV block (", per_block, " bytes)");
    return blocks;
}

void Worker::init_kv_cache(int num_blocks) {
    PG_CHECK(model_ && !cache_, "init_kv_cache: call load_model first, once");
    const KvCacheShape shape = model_->kv_cache_shape(num_blocks, config_.block_size);
    cache_ = std::make_unique<KvCache>(*backend_, shape);
    for (int l = 0; l < shape.num_layers; ++l) {
        if (cache_->k(l).empty()) continue;  // a layer of another pipeline stage
        cache_tensors_.push_back(cache_->k(l));
        cache_tensors_.push_back(cache_->v(l));
    }
    if (own_model_ && place_.verbose)
        std::fprintf(stderr, "  KV cache: %d blocks of %d tokens (%.1f MiB, %s), holds %lld tokens\n", num_blocks,
                     shape.block_size, num_blocks * static_cast<double>(shape.bytes_per_block()) / (1 << 20),
                     std::string(dtype_name(shape.dtype)).c_str(),
                     static_cast<long long>(num_blocks) * shape.block_size);
    if (own_model_ && place_.verbose)
        std::fprintf(stderr, "  scheduler: at most %d sequences and %d tokens a step\n", config_.max_num_seqs,
                     config_.max_num_batched_tokens);
    if (own_model_)
        max_model_len_ = settle_max_model_len(config_.max_model_len, model_->config().max_position_embeddings,
                                              static_cast<int64_t>(num_blocks) * shape.block_size,
                                              shape.bytes_per_block() / shape.block_size, place_.verbose);
    if (own_model_ && !sampler_) {  // a borrowed model samples with the sampler it was given, if any
        own_sampler_ = backend_->make_sampler(config_.max_num_seqs, model_->config().vocab_size);
        sampler_ = own_sampler_.get();
    }
}

// Runs one decode step of every batch bucket the backend records (CUDA graphs), so the
// recordings, the first launch of each kernel and the decode products' algorithm timing happen
// before the first request instead of inside its time to first token. A recording may also
// depend on the context length (CUDA: the decode attention's shape at <= 4 sequences), so
// each bucket runs at 1 and at 512 tokens of context. The steps write one cache slot per
// sequence in blocks [0, bucket * blocks per sequence): free blocks, written again before any read.
void Worker::warm_up() {
    PG_CHECK(cache_, "warm_up: call init_kv_cache first");
    const int block_size = config_.block_size;
    const auto t0 = Clock::now();
    int steps = 0, last = 0;
    for (int n = 1; n <= config_.max_num_seqs; ++n) {
        const int bucket = backend_->step_bucket(n);
        if (bucket <= 0 || bucket == last) continue;
        last = bucket;
        for (const int context : {1, 512}) {
            const int blocks = (context + block_size - 1) / block_size, pos = context - 1;
            if (static_cast<int64_t>(bucket) * blocks > num_kv_blocks()) continue;
            BatchInput b;
            b.max_blocks_per_seq = blocks;
            b.query_start.push_back(0);
            for (int s = 0; s < bucket; ++s) {
                b.token_ids.push_back(0);
                b.positions.push_back(pos);
                b.slot_mapping.push_back((s * blocks + pos / block_size) * block_size + pos % block_size);
                for (int i = 0; i < blocks; ++i) b.block_tables.push_back(s * blocks + i);
                b.context_lens.push_back(context);
                b.query_start.push_back(s + 1);
                b.logits_indices.push_back(s);
            }
            execute_on_device(b);
            ++steps;
        }
    }
    if (steps > 0 && place_.verbose)
        std::fprintf(stderr, "  ran %d decode steps to record their graphs (%.2fs)\n", steps, seconds_since(t0));
    backend_->synchronize();
    backend_->end_warm_up();
}

const LoadedModel& Worker::loaded() const {
    PG_CHECK(loaded_, "loaded(): this worker's model was built by its caller");
    return *loaded_;
}

int Worker::host_kv_blocks_for(int64_t bytes) const {
    PG_CHECK(cache_, "host_kv_blocks_for: call init_kv_cache first");
    if (bytes < 0) fail("--kv-offload-memory must be >= 0 bytes, got ", bytes);
    if (bytes == 0) return 0;
    const int64_t per_block = static_cast<int64_t>(kv_block_bytes());
    const int64_t blocks = std::min<int64_t>(bytes / per_block, 1 << 30);
    if (blocks < 1)
        fail("--kv-offload-memory ", bytes, " is less than one KV block (", per_block,
             " bytes, every layer's K and V)");
    return static_cast<int>(blocks);
}

void Worker::init_host_kv_cache(int64_t bytes) {
    init_host_kv_blocks(host_kv_blocks_for(bytes));
}

void Worker::init_host_kv_blocks(int blocks) {
    PG_CHECK(cache_ && !host_kv_ && blocks >= 0, "init_host_kv_blocks: call init_kv_cache first, once");
    if (blocks == 0) return;
    const int64_t per_block = static_cast<int64_t>(kv_block_bytes());
    host_kv_ = backend_->allocate_host(static_cast<size_t>(blocks * per_block));
    host_blocks_ = static_cast<int>(blocks);
    if (own_model_ && place_.verbose)
        std::fprintf(stderr, "  KV host tier: %d blocks (%.1f MiB)\n", host_blocks_,
                     blocks * static_cast<double>(per_block) / (1 << 20));
}

size_t Worker::kv_block_bytes() const {
    size_t bytes = 0;
    for (const Tensor& t : cache_tensors_) bytes += t.nbytes() / static_cast<size_t>(t.dim(0));
    return bytes;
}

void Worker::offload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    if (pairs.empty()) return;
    PG_CHECK(host_kv_, "offload_blocks without a host tier");
    for (const auto& [block, slot] : pairs) PG_CHECK(slot >= 0 && slot < host_blocks_, "host slot ", slot);
    backend_->make_current();
    backend_->copy_blocks_to_host(cache_tensors_, pairs, host_kv_, kv_block_bytes());
}

void Worker::onload_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    if (pairs.empty()) return;
    PG_CHECK(host_kv_, "onload_blocks without a host tier");
    for (const auto& [slot, block] : pairs) PG_CHECK(slot >= 0 && slot < host_blocks_, "host slot ", slot);
    backend_->make_current();
    backend_->copy_blocks_from_host(host_kv_, kv_block_bytes(), pairs, cache_tensors_);
}

void Worker::wait_host_kv() {
    backend_->make_current();
    backend_->synchronize();
}

DType Worker::kv_cache_dtype() const {
    return cache_->shape().dtype;
}

int Worker::num_kv_blocks() const {
    return cache_->shape().num_blocks;
}

int Worker::block_size() const {
    return cache_->shape().block_size;
}

// The step entry points below run on the engine's thread, which did not build the backend:
// each first makes the device that thread's own.
void Worker::copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& pairs) {
    if (pairs.empty()) return;
    backend_->make_current();
    for (int l = 0; l < cache_->shape().num_layers; ++l) {
        backend_->copy_blocks(cache_->k(l), pairs);
        backend_->copy_blocks(cache_->v(l), pairs);
    }
}

void Worker::execute(const BatchInput& batch, std::vector<float>& logits) {
    backend_->make_current();
    model_->forward(batch, *cache_, logits);
}

void Worker::execute_on_device(const BatchInput& batch) {
    backend_->make_current();
    *device_logits_ = model_->forward_device(batch, *cache_);
}

void Worker::launch_sampling(const std::vector<SampleRow>& rows) {
    PG_CHECK(sampler_ && !device_logits_->empty(), "launch_sampling without execute_on_device");
    backend_->make_current();
    sampler_->launch(*device_logits_, rows);
}

void Worker::collect_samples(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) {
    PG_CHECK(sampler_, "collect_samples without a device sampler");
    backend_->make_current();
    sampler_->collect(tokens, logprobs);
}

void Worker::pool(const BatchInput& batch, std::vector<float>& out) {
    backend_->make_current();
    model_->pool(batch, out);
}

int Worker::max_fed_draws() const {
    return sampler_ ? sampler_->max_fed_draws() : 0;
}

}  // namespace peregrine
