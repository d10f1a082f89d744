// Choosing the next token from logits: greedy, or temperature with top-k / top-p.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace peregrine {

struct SamplingOptions {
    float temperature = 1.0f;  // 0 = greedy
    float top_p = 1.0f;
    int top_k = 0;  // 0 = no limit
};

class TokenSampler {
  public:
    explicit TokenSampler(uint64_t seed) : rng_(seed) {}
    // logits: [vocab]
    int sample(const float* logits, int vocab, const SamplingOptions& opt);

  private:
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int>> cand_;
};

// Index of the largest value; the first one on ties (as torch.argmax).
int argmax(const float* x, int n);

}  // namespace peregrine
