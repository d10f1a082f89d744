#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace peregrine {

void fill_logprobs(const float* logits, int vocab, int top, TokenLogprob* out,
                   std::vector<std::pair<float, int32_t>>& scratch) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
    double z = 0;
    for (int i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(logits[i] - mx));
    const float log_z = mx + static_cast<float>(std::log(z));
    const float own = logits[out->token];
    out->logprob = own - log_z;
    int32_t at_least = 0;  // tokens as likely as `token` or more, itself included
    for (int i = 0; i < vocab; ++i) at_least += logits[i] >= own ? 1 : 0;
    out->rank = std::max<int32_t>(at_least, 1);  // 1 even for a NaN logit
    out->top.clear();
    if (top <= 0) return;
    scratch.resize(vocab);
    for (int i = 0; i < vocab; ++i) scratch[i] = {logits[i], i};
    top = std::min(top, vocab);
    std::partial_sort(scratch.begin(), scratch.begin() + top, scratch.end(), by_logit);
    for (int i = 0; i < top; ++i) out->top.emplace_back(scratch[i].second, scratch[i].first - log_z);
}

}  // namespace peregrine
