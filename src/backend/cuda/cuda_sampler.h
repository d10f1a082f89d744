// The engine's DeviceSampler on the CUDA backend: builds each draw's parameters and penalty
// lists on the host, runs cuda::sample on the step's logits where they lie, and copies back
// only token ids (and logprobs when asked).
#pragma once

#include <memory>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "engine/model_runner.h"

namespace peregrine {

class CudaSampler final : public DeviceSampler {
  public:
    // Room for `max_rows` draws per step over `vocab` logits; buffers are allocated here once
    // (penalty lists grow on demand).
    CudaSampler(CudaBackend& backend, int max_rows, int vocab);
    ~CudaSampler() override;
    CudaSampler(const CudaSampler&) = delete;
    CudaSampler& operator=(const CudaSampler&) = delete;

    void sample(const Tensor& logits, const std::vector<SampleSpec>& specs, std::vector<int32_t>& tokens,
                std::vector<TokenLogprob>& logprobs) override;

  private:
    struct Buffers;
    CudaBackend& backend_;
    int max_rows_, vocab_;
    std::unique_ptr<Buffers> b_;
};

}  // namespace peregrine
