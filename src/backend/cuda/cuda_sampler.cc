#include "backend/cuda/cuda_sampler.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <unordered_map>

#include "backend/cuda/cuda_check.h"
#include "peregrine/engine_types.h"

namespace peregrine {

namespace {
template <typename T>
T* device_alloc(size_t n) {
    void* p = nullptr;
    PG_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    return static_cast<T*>(p);
}
template <typename T>
T* host_alloc(size_t n) {
    void* p = nullptr;
    PG_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(n, 1) * sizeof(T)));
    return static_cast<T*>(p);
}
}  // namespace

struct CudaSampler::Buffers {
    float* gathered = nullptr;  // [max_rows, vocab]: logits rows in draw order when rows repeat
    cuda::SamplingRow* rows_dev = nullptr;
    cuda::SamplingRow* rows_host = nullptr;
    int32_t* pen_dev = nullptr;  // offsets [max_rows + 1], then tokens [pen_cap], counts [pen_cap]
    int32_t* pen_host = nullptr;
    size_t pen_cap = 0;
    // Results: tokens [max_rows], chosen logprob [max_rows], top ids / logprobs [max_rows, 20].
    int32_t* tok_dev = nullptr;
    float* lp_dev = nullptr;
    int32_t* top_ids_dev = nullptr;
    float* top_lp_dev = nullptr;
    int32_t* tok_host = nullptr;
    int32_t* tok_host_dev = nullptr;  // tok_host as the device addresses it
    float* lp_host = nullptr;
    int32_t* top_ids_host = nullptr;
    float* top_lp_host = nullptr;
    void* workspace = nullptr;
    // Structured output, allocated at the first constrained draw: the masks of a launch's
    // constrained rows [max_rows, words] and, after them, the row each applies to [max_rows].
    uint32_t* mask_dev = nullptr;
    uint32_t* mask_host = nullptr;
    cudaEvent_t done = nullptr;  // after the last launch's copies back
};

CudaSampler::CudaSampler(CudaBackend& backend, int max_rows, int vocab)
    : backend_(backend), max_rows_(max_rows), vocab_(vocab), b_(std::make_unique<Buffers>()) {
    const size_t r = static_cast<size_t>(max_rows), k = cuda::kMaxSampleLogprobs;
    b_->gathered = device_alloc<float>(r * vocab);
    b_->rows_dev = device_alloc<cuda::SamplingRow>(r);
    b_->rows_host = host_alloc<cuda::SamplingRow>(r);
    b_->tok_dev = device_alloc<int32_t>(r);
    b_->lp_dev = device_alloc<float>(r);
    b_->top_ids_dev = device_alloc<int32_t>(r * k);
    b_->top_lp_dev = device_alloc<float>(r * k);
    b_->tok_host = host_alloc<int32_t>(r);
    PG_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&b_->tok_host_dev), b_->tok_host, 0));
    b_->lp_host = host_alloc<float>(r);
    b_->top_ids_host = host_alloc<int32_t>(r * k);
    b_->top_lp_host = host_alloc<float>(r * k);
    PG_CUDA_CHECK(cudaMalloc(&b_->workspace, std::max<size_t>(cuda::sample_workspace_bytes(max_rows, vocab), 1)));
    PG_CUDA_CHECK(cudaEventCreateWithFlags(&b_->done, cudaEventDisableTiming));
    backend_.set_token_feed(b_->tok_dev, max_rows);
}

CudaSampler::~CudaSampler() {
    for (void* p :
         {static_cast<void*>(b_->gathered), static_cast<void*>(b_->rows_dev), static_cast<void*>(b_->pen_dev),
          static_cast<void*>(b_->tok_dev), static_cast<void*>(b_->lp_dev), static_cast<void*>(b_->top_ids_dev),
          static_cast<void*>(b_->top_lp_dev), b_->workspace, static_cast<void*>(b_->mask_dev)})
        if (p) cudaFree(p);
    for (void* p :
         {static_cast<void*>(b_->rows_host), static_cast<void*>(b_->pen_host), static_cast<void*>(b_->tok_host),
          static_cast<void*>(b_->lp_host), static_cast<void*>(b_->top_ids_host), static_cast<void*>(b_->top_lp_host),
          static_cast<void*>(b_->mask_host)})
        if (p) cudaFreeHost(p);
    if (b_->done) cudaEventDestroy(b_->done);
}

void CudaSampler::launch(const Tensor& logits, const std::vector<SampleRow>& rows) {
    PG_CHECK(!queued_, "CudaSampler: launch before the previous launch was collected");
    const int n = static_cast<int>(rows.size());
    done_tokens_.clear();
    done_logprobs_.clear();
    if (n <= max_rows_) {
        enqueue(logits, rows);
        return;
    }
    // More draws than rows (choices forked this step): in pieces, each waited for.
    for (int i = 0; i < n; i += max_rows_) {
        const std::vector<SampleRow> part(rows.begin() + i, rows.begin() + std::min(n, i + max_rows_));
        std::vector<int32_t> t;
        std::vector<TokenLogprob> l;
        enqueue(logits, part);
        collect(t, l);
        done_tokens_.insert(done_tokens_.end(), t.begin(), t.end());
        std::move(l.begin(), l.end(), std::back_inserter(done_logprobs_));
    }
}

void CudaSampler::collect(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) {
    if (!queued_) {  // sampled in pieces by launch
        tokens = done_tokens_;
        logprobs = std::move(done_logprobs_);
        done_logprobs_.clear();
        return;
    }
    queued_ = false;
    const int n = static_cast<int>(top_.size());
    tokens.resize(n);
    logprobs.resize(n);
    if (n == 0) return;
    PG_CUDA_CHECK(cudaEventSynchronize(b_->done));  // not the stream: a later step may be queued behind
    const size_t k = cuda::kMaxSampleLogprobs;
    for (int i = 0; i < n; ++i) {
        tokens[i] = b_->tok_host[i];
        if (top_[i] < 0) continue;
        TokenLogprob& lp = logprobs[i];
        lp.token = tokens[i];
        lp.logprob = b_->lp_host[i];
        lp.top.clear();
        for (int j = 0; j < top_[i]; ++j) lp.top.emplace_back(b_->top_ids_host[i * k + j], b_->top_lp_host[i * k + j]);
    }
}

// The pinned parameter / penalty buffers written here were last read by the previous launch's
// copies, which finished before its collect returned (launch and collect alternate).
void CudaSampler::enqueue(const Tensor& logits, const std::vector<SampleRow>& draws) {
    const int n = static_cast<int>(draws.size());
    queued_ = true;
    top_.assign(n, -1);
    for (int i = 0; i < n; ++i)
        if (draws[i].num_logprobs >= 0) top_[i] = std::min(draws[i].num_logprobs, cuda::kMaxSampleLogprobs);
    if (n == 0) return;
    PG_CHECK(logits.dtype == DType::F32 && logits.cols() == vocab_);
    cudaStream_t stream = backend_.stream();

    // The kernel edits rows in place, one per draw: use the logits directly when draws map to
    // rows 0..n-1 in order (the usual case), else gather copies (choices sharing a prompt row).
    bool identity = logits.rows() >= n;
    for (int i = 0; identity && i < n; ++i) identity = draws[i].logits_row == i;
    float* rows = logits.ptr<float>();
    if (!identity) {
        for (int i = 0; i < n; ++i)
            PG_CUDA_CHECK(cudaMemcpyAsync(b_->gathered + static_cast<size_t>(i) * vocab_,
                                          logits.ptr<float>() + static_cast<size_t>(draws[i].logits_row) * vocab_,
                                          vocab_ * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        rows = b_->gathered;
    }

    // Parameters and penalty lists (distinct tokens of prompt + output, with output counts).
    bool any_penalty = false, any_logprobs = false;
    std::vector<int32_t> pen_tokens, pen_counts;
    std::vector<int32_t> offsets(1, 0);
    std::unordered_map<int32_t, int32_t> count;
    for (int i = 0; i < n; ++i) {
        const SampleRow& d = draws[i];
        PG_CHECK(!d.needs_host(), "CudaSampler: a row that needs host-only processing");
        cuda::SamplingRow& r = b_->rows_host[i];
        r = cuda::SamplingRow{};
        r.temperature = d.temperature;
        r.top_k = d.top_k;
        r.top_p = d.top_p;
        r.min_p = d.min_p;
        r.repetition_penalty = d.repetition_penalty;
        r.presence_penalty = d.presence_penalty;
        r.frequency_penalty = d.frequency_penalty;
        r.seed = d.seed;
        r.offset = d.offset;
        r.num_logprobs = top_[i];
        any_logprobs |= d.num_logprobs >= 0;
        if (r.penalised()) {
            any_penalty = true;
            count.clear();
            // Prompt tokens count for the repetition penalty only (with an output count of 0).
            if (d.repetition_penalty != 1.0f)
                for (int32_t tok : d.prompt) count.try_emplace(tok, 0);
            for (int32_t tok : d.output) ++count[tok];
            for (const auto& [tok, c] : count) {
                pen_tokens.push_back(tok);
                pen_counts.push_back(c);
            }
        }
        offsets.push_back(static_cast<int32_t>(pen_tokens.size()));
    }
    upload_masks(rows, draws);
    // Greedy rows without penalties or logprobs take the argmax fast path (no parameters to send).
    bool all_greedy = !any_penalty && !any_logprobs;
    for (int i = 0; all_greedy && i < n; ++i) all_greedy = b_->rows_host[i].greedy();
    if (!all_greedy)
        PG_CUDA_CHECK(cudaMemcpyAsync(b_->rows_dev, b_->rows_host, n * sizeof(cuda::SamplingRow),
                                      cudaMemcpyHostToDevice, stream));
    cuda::PenaltyArgs pen;
    if (any_penalty) {
        const size_t m = pen_tokens.size();
        const size_t need = (n + 1) + 2 * m;
        if (need > b_->pen_cap) {  // grows rarely: long penalised sequences
            backend_.synchronize();
            if (b_->pen_dev) cudaFree(b_->pen_dev);
            if (b_->pen_host) cudaFreeHost(b_->pen_host);
            b_->pen_cap = std::max(need * 2, size_t{1} << 16);
            b_->pen_dev = device_alloc<int32_t>(b_->pen_cap);
            b_->pen_host = host_alloc<int32_t>(b_->pen_cap);
        }
        std::memcpy(b_->pen_host, offsets.data(), (n + 1) * sizeof(int32_t));
        std::memcpy(b_->pen_host + n + 1, pen_tokens.data(), m * sizeof(int32_t));
        std::memcpy(b_->pen_host + n + 1 + m, pen_counts.data(), m * sizeof(int32_t));
        PG_CUDA_CHECK(
            cudaMemcpyAsync(b_->pen_dev, b_->pen_host, need * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
        pen.offsets = b_->pen_dev;
        pen.tokens = b_->pen_dev + n + 1;
        pen.counts = b_->pen_dev + n + 1 + m;
    }
    if (all_greedy) {  // the kernel writes the tokens to the host as well: no copy after it
        cuda::greedy_argmax(rows, n, vocab_, b_->tok_dev, b_->tok_host_dev, b_->workspace, stream);
    } else {
        cuda::sample(rows, n, vocab_, b_->rows_dev, pen, b_->tok_dev, b_->lp_dev, b_->top_ids_dev, b_->top_lp_dev,
                     b_->workspace, stream);
        PG_CUDA_CHECK(cudaMemcpyAsync(b_->tok_host, b_->tok_dev, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    }
    const size_t k = cuda::kMaxSampleLogprobs;
    if (any_logprobs) {
        PG_CUDA_CHECK(cudaMemcpyAsync(b_->lp_host, b_->lp_dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
        PG_CUDA_CHECK(cudaMemcpyAsync(b_->top_ids_host, b_->top_ids_dev, n * k * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream));
        PG_CUDA_CHECK(
            cudaMemcpyAsync(b_->top_lp_host, b_->top_lp_dev, n * k * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    PG_CUDA_CHECK(cudaEventRecord(b_->done, stream));
}

// The constrained draws' masks, packed, to the device, then applied to their rows in place.
void CudaSampler::upload_masks(float* rows, const std::vector<SampleRow>& draws) {
    const int n = static_cast<int>(draws.size());
    const size_t words = (static_cast<size_t>(vocab_) + 31) / 32;
    int m = 0;
    for (int i = 0; i < n; ++i) {
        const SampleRow& d = draws[i];
        if (!d.constrained) continue;
        if (!b_->mask_host) {
            const size_t total = static_cast<size_t>(max_rows_) * (words + 1);
            b_->mask_dev = device_alloc<uint32_t>(total);
            b_->mask_host = host_alloc<uint32_t>(total);
        }
        uint32_t* dst = b_->mask_host + static_cast<size_t>(m) * words;
        const size_t have = std::min(words, d.allowed.size());
        std::memcpy(dst, d.allowed.data(), have * sizeof(uint32_t));
        std::memset(dst + have, 0, (words - have) * sizeof(uint32_t));
        b_->mask_host[static_cast<size_t>(max_rows_) * words + m] = static_cast<uint32_t>(i);
        ++m;
    }
    if (m == 0) return;
    cudaStream_t stream = backend_.stream();
    const size_t index_at = static_cast<size_t>(max_rows_) * words;
    PG_CUDA_CHECK(cudaMemcpyAsync(b_->mask_dev, b_->mask_host, static_cast<size_t>(m) * words * sizeof(uint32_t),
                                  cudaMemcpyHostToDevice, stream));
    PG_CUDA_CHECK(cudaMemcpyAsync(b_->mask_dev + index_at, b_->mask_host + index_at, m * sizeof(uint32_t),
                                  cudaMemcpyHostToDevice, stream));
    cuda::apply_token_masks(rows, vocab_, b_->mask_dev, reinterpret_cast<const int32_t*>(b_->mask_dev + index_at), m,
                            static_cast<int>(words), stream);
}

}  // namespace peregrine
