#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "core/error.h"
#include "engine/logprobs.h"

namespace peregrine {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// First index of the largest value. Lane-wise maxima first (a loop the compiler vectorises),
// then one scan for the first index holding the maximum.
int32_t argmax(const float* x, int n) {
    constexpr int kLanes = 16;
    float lanes[kLanes];
    for (int j = 0; j < kLanes; ++j) lanes[j] = kNegInf;
    int i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
    float mx = kNegInf;
    for (int j = 0; j < kLanes; ++j) mx = std::max(mx, lanes[j]);
    for (; i < n; ++i) mx = std::max(mx, x[i]);
    for (int k = 0; k < n; ++k)
        if (x[k] == mx) return k;
    return 0;  // all NaN
}
}  // namespace

SampleRow sample_row(Sequence& seq, int logits_row, bool logprobs) {
    const SamplingParams& p = *seq.sampling;
    SampleRow r;
    r.logits_row = logits_row;
    r.temperature = p.temperature;
    r.top_p = p.top_p;
    r.top_k = p.top_k;
    r.min_p = p.min_p;
    r.repetition_penalty = p.repetition_penalty;
    r.presence_penalty = p.presence_penalty;
    r.frequency_penalty = p.frequency_penalty;
    r.seed = seq.seed;
    r.offset = static_cast<uint64_t>(seq.num_output());
    r.rng = &seq.rng;
    const std::span<const int32_t> tokens(seq.tokens);
    r.prompt = tokens.first(seq.num_prompt_tokens);
    r.output = tokens.subspan(seq.num_prompt_tokens);
    r.num_logprobs = logprobs ? std::min(p.logprobs, kMaxLogprobs) : -1;
    r.logit_bias = p.logit_bias;
    r.stop_token_ids = p.stop_token_ids;
    // min_tokens never masks the end a grammar can only take (nothing else would be left).
    r.mask_end = seq.num_output() < p.min_tokens && !(seq.grammar && seq.grammar->can_only_end());
    r.constrained = seq.grammar.has_value();
    r.allowed = seq.allowed;
    return r;
}

int32_t Sampler::sample(const float* logits, int vocab, const SampleRow& p, TokenLogprob* logprob) {
    const float* l = logits;
    if (p.processes_logits()) {
        work_.assign(logits, logits + vocab);
        float* w = work_.data();
        for (const auto& [tok, bias] : p.logit_bias)
            if (tok >= 0 && tok < vocab) w[tok] += bias;
        if (p.mask_end) {
            for (int32_t t : eos_ids_)
                if (t >= 0 && t < vocab) w[t] = kNegInf;
            for (int32_t t : p.stop_token_ids)
                if (t >= 0 && t < vocab) w[t] = kNegInf;
        }
        if (p.constrained) {
            const int64_t covered = std::min<int64_t>(vocab, static_cast<int64_t>(p.allowed.size()) * 32);
            for (int64_t t = 0; t < covered; ++t)
                if (!((p.allowed[static_cast<size_t>(t >> 5)] >> (t & 31)) & 1u)) w[t] = kNegInf;
            for (int64_t t = covered; t < vocab; ++t) w[t] = kNegInf;
        }
        if (p.repetition_penalty != 1.0f) {
            seen_.resize(vocab);
            for (std::span<const int32_t> part : {p.prompt, p.output})
                for (int32_t t : part) {
                    if (t < 0 || t >= vocab || seen_[t]) continue;
                    seen_[t] = 1;
                    w[t] = w[t] > 0 ? w[t] / p.repetition_penalty : w[t] * p.repetition_penalty;
                }
            for (std::span<const int32_t> part : {p.prompt, p.output})
                for (int32_t t : part)
                    if (t >= 0 && t < vocab) seen_[t] = 0;
        }
        if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
            counts_.resize(vocab);
            for (int32_t t : p.output) ++counts_[t];
            for (int32_t t : p.output) {
                if (counts_[t] == 0) continue;  // already applied
                w[t] -= p.frequency_penalty * counts_[t] + p.presence_penalty;
                counts_[t] = 0;
            }
        }
        l = w;
    }

    int32_t chosen;
    if (p.greedy()) {
        chosen = argmax(l, vocab);
    } else {
        const float mx = l[argmax(l, vocab)];
        // Candidates: min_p keeps p >= min_p * p_max, i.e. logit >= max + T * ln(min_p).
        // Tokens below e^-30 of the best carry no mass that could matter.
        const float floor_logit = p.min_p > 0.0f ? mx + p.temperature * std::log(p.min_p) : mx - 30.0f * p.temperature;
        cand_.clear();
        for (int i = 0; i < vocab; ++i)
            if (l[i] >= floor_logit) cand_.emplace_back(l[i], i);
        size_t keep = cand_.size();
        if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) {
            keep = p.top_k;
            std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
        }
        // Weights e^((l - max) / T) in place; the order of cand_ is by id unless sorted above.
        const float inv_t = 1.0f / p.temperature;
        double total = 0;
        for (size_t i = 0; i < keep; ++i) {
            cand_[i].first = std::exp((cand_[i].first - mx) * inv_t);
            total += cand_[i].first;
        }
        if (p.top_p < 1.0f) {
            // The smallest most-likely prefix whose mass reaches top_p: sort a growing head
            // of the candidates until it holds that mass (rarely more than a few hundred).
            const bool sorted = p.top_k > 0;
            size_t head = sorted ? keep : std::min<size_t>(keep, 256);
            for (;;) {
                if (!sorted) {
                    std::nth_element(cand_.begin(), cand_.begin() + (head - 1), cand_.begin() + keep, by_logit);
                    std::sort(cand_.begin(), cand_.begin() + head, by_logit);
                }
                double mass = 0;
                size_t cut = 0;
                for (; cut < head && mass < p.top_p * total; ++cut) mass += cand_[cut].first;
                if (mass >= p.top_p * total || head == keep) {
                    keep = cut;
                    total = mass;
                    break;
                }
                head = std::min(keep, head * 8);
            }
        }
        PG_CHECK(p.rng != nullptr, "a sampled (not greedy) row without a generator");
        double u = std::uniform_real_distribution<double>(0.0, total)(*p.rng);
        chosen = cand_[keep - 1].second;
        for (size_t i = 0; i < keep; ++i) {
            u -= cand_[i].first;
            if (u < 0) {
                chosen = cand_[i].second;
                break;
            }
        }
    }
    if (logprob) {
        logprob->token = chosen;
        fill_logprobs(logits, vocab, std::min(p.num_logprobs, kMaxLogprobs), logprob, cand_);
    }
    return chosen;
}

}  // namespace peregrine
