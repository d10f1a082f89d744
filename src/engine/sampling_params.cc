// validate(SamplingParams): the one list of sampling rules. Messages quote the field as the
// OpenAI API spells it and name the value, as the HTTP layer has always worded them.
#include <cmath>
#include <sstream>
#include <utility>

#include "peregrine/engine_types.h"

namespace peregrine {

namespace {

class Errors {
  public:
    template <typename... Args>
    void add(const char* field, Args&&... parts) {
        std::ostringstream os;
        (os << ... << std::forward<Args>(parts));
        out.push_back({field, os.str()});
    }
    std::vector<FieldError> out;
};

// A float field in [lo, hi] (finite); `range` says it as the message does, e.g. "[0, 1]".
void check_closed(Errors& e, const char* field, float v, float lo, float hi, const char* range) {
    if (!(v >= lo && v <= hi)) e.add(field, "'", field, "' must be in ", range, ", got ", v);
}

}  // namespace

std::vector<FieldError> validate(const SamplingParams& p, const SamplingLimits& limits) {
    Errors e;
    if (limits.max_n > 0 && (p.n < 1 || p.n > limits.max_n))
        e.add("n", "'n' must be between 1 and ", limits.max_n, ", got ", p.n);
    else if (p.n < 1)
        e.add("n", "'n' must be at least 1, got ", p.n);
    else if (limits.max_num_seqs > 0 && p.n > limits.max_num_seqs)
        // (Starts with "n ": older callers find the field by the message's first word.)
        e.add("n", "n (", p.n, ") is more than the engine runs at once (max_num_seqs ", limits.max_num_seqs, ")");
    if (!(p.temperature >= 0.0f))
        e.add("temperature", "'temperature' must be at least 0, got ", p.temperature);
    else if (!std::isfinite(p.temperature))
        e.add("temperature", "'temperature' must be a finite number, got ", p.temperature);
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) e.add("top_p", "'top_p' must be in (0, 1], got ", p.top_p);
    if (p.top_k < 0) e.add("top_k", "'top_k' must be at least 0 (0 = no limit), got ", p.top_k);
    check_closed(e, "min_p", p.min_p, 0.0f, 1.0f, "[0, 1]");
    if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty)))
        e.add("repetition_penalty", "'repetition_penalty' must be > 0, got ", p.repetition_penalty);
    check_closed(e, "presence_penalty", p.presence_penalty, -kMaxPenalty, kMaxPenalty, "[-2, 2]");
    check_closed(e, "frequency_penalty", p.frequency_penalty, -kMaxPenalty, kMaxPenalty, "[-2, 2]");
    for (const auto& [tok, bias] : p.logit_bias) {
        if (tok < 0 || (limits.vocab_size > 0 && tok >= limits.vocab_size)) {
            if (limits.vocab_size > 0)
                e.add("logit_bias", "'logit_bias' token id ", tok, " is outside the vocabulary (0..",
                      limits.vocab_size - 1, ")");
            else
                e.add("logit_bias", "'logit_bias' token id ", tok, " is negative");
            break;
        }
        if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
            e.add("logit_bias", "'logit_bias' values must be in [-100, 100], got ", bias);
            break;
        }
    }
    if (!p.stop.empty() && !limits.has_tokenizer) e.add("stop", "'stop' strings need a tokenizer");
    for (const std::string& s : p.stop)
        if (s.empty()) {
            e.add("stop", "'stop' strings must not be empty");
            break;
        }
    if (p.min_tokens < 0) e.add("min_tokens", "'min_tokens' must be at least 0, got ", p.min_tokens);
    if (p.max_tokens < 1) e.add("max_tokens", "'max_tokens' must be at least 1, got ", p.max_tokens);
    if (p.min_tokens > p.max_tokens && p.max_tokens >= 1)
        e.add("min_tokens", "'min_tokens' (", p.min_tokens, ") must not exceed 'max_tokens' (", p.max_tokens, ")");
    // -1 is "none"; a client asks for 0..max_logprobs.
    if (limits.max_logprobs > 0 && (p.logprobs < -1 || p.logprobs > limits.max_logprobs))
        e.add("logprobs", "'logprobs' must be between 0 and ", limits.max_logprobs, ", got ", p.logprobs);
    else if (p.logprobs < -1)
        e.add("logprobs", "'logprobs' must be at least 0, got ", p.logprobs);
    if (limits.max_logprobs > 0 && (p.prompt_logprobs < -1 || p.prompt_logprobs > limits.max_logprobs))
        e.add("prompt_logprobs", "'prompt_logprobs' must be between 0 and ", limits.max_logprobs, ", got ",
              p.prompt_logprobs);
    else if (p.prompt_logprobs < -1)
        e.add("prompt_logprobs", "'prompt_logprobs' must be at least 0, got ", p.prompt_logprobs);
    return std::move(e.out);
}

}  // namespace peregrine
