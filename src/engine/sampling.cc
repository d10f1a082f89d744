#include "engine/sampling.h"

#include <algorithm>
#include <cmath>

namespace peregrine {

int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

int TokenSampler::sample(const float* logits, int vocab, const SamplingOptions& opt) {
    if (opt.temperature <= 0.0f || opt.top_k == 1) return argmax(logits, vocab);
    cand_.resize(vocab);
    for (int i = 0; i < vocab; ++i) cand_[i] = {logits[i] / opt.temperature, i};
    // Sorted by probability, highest first (ties by id, for reproducibility).
    auto by_prob = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t keep = static_cast<size_t>(vocab);
    if (opt.top_k > 0 && static_cast<size_t>(opt.top_k) < keep) {
        keep = opt.top_k;
        std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_prob);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_prob);
    }
    const float mx = cand_[0].first;
    double total = 0;
    for (size_t i = 0; i < keep; ++i) {
        cand_[i].first = std::exp(cand_[i].first - mx);
        total += cand_[i].first;
    }
    if (opt.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
        double mass = 0;
        for (size_t i = 0; i < keep; ++i) {
            mass += cand_[i].first / total;
            if (mass >= opt.top_p) {
                keep = i + 1;
                break;
            }
        }
        total = 0;
        for (size_t i = 0; i < keep; ++i) total += cand_[i].first;
    }
    double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
    for (size_t i = 0; i < keep; ++i) {
        u -= cand_[i].first;
        if (u <= 0) return cand_[i].second;
    }
    return cand_[keep - 1].second;
}

}  // namespace peregrine
