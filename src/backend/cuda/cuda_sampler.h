// DeviceSampler on the CUDA backend: packs each row's parameters and penalty lists on the
// host, queues cuda::sample on the step's logits where they lie, and copies back only token ids
// (and logprobs when asked). The drawn ids stay in a device buffer that the backend's embedding
// reads for the next step's placeholder tokens (async scheduling).
#pragma once

#include <memory>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/device_sampler.h"

namespace peregrine {

class CudaSampler final : public DeviceSampler {
  public:
    // Room for `max_rows` draws per step over `vocab` logits; buffers are allocated here once
    // (penalty lists grow on demand).
    CudaSampler(CudaBackend& backend, int max_rows, int vocab);
    ~CudaSampler() override;
    CudaSampler(const CudaSampler&) = delete;
    CudaSampler& operator=(const CudaSampler&) = delete;

    void launch(const Tensor& logits, const std::vector<SampleRow>& rows) override;
    void collect(std::vector<int32_t>& tokens, std::vector<TokenLogprob>& logprobs) override;
    int max_fed_draws() const override { return max_rows_; }

  private:
    struct Buffers;
    // Queues at most max_rows_ draws; the results land in the pinned buffers when done_ fires.
    void enqueue(const Tensor& logits, const std::vector<SampleRow>& rows);
    // Structured output: masks the constrained draws' rows of `rows` ([draws, vocab], draw i at
    // row i) on the stream, before the sampling kernels read them.
    void upload_masks(float* rows, const std::vector<SampleRow>& draws);
    CudaBackend& backend_;
    int max_rows_, vocab_;
    std::unique_ptr<Buffers> b_;
    // The launch being collected: its draws' top-logprob counts (-1 = no logprobs), or, for
    // more draws than rows (sampled in pieces, synchronously), the finished results.
    std::vector<int> top_;
    bool queued_ = false;
    std::vector<int32_t> done_tokens_;
    std::vector<TokenLogprob> done_logprobs_;
};

}  // namespace peregrine
