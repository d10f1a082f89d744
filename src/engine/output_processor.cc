#include "engine/output_processor.h"

#include <algorithm>

namespace peregrine {

RequestText::RequestText(const TextProcessor& text, const Request& request)
    : processor_(text),
      prompt_(request.prompt_ids),
      stops_(request.sampling.stop),
      skip_special_(request.sampling.skip_special_tokens) {
    choices_.resize(static_cast<size_t>(std::max(1, request.sampling.n)));
}

RequestText::Choice& RequestText::choice(int index) {
    if (static_cast<size_t>(index) >= choices_.size()) choices_.resize(static_cast<size_t>(index) + 1);
    Choice& c = choices_[static_cast<size_t>(index)];
    if (!c.text && !c.done) c.text = processor_.start(prompt_, stops_, skip_special_);
    return c;
}

bool RequestText::process(RequestOutput& out, int* stopped) {
    *stopped = -1;
    Choice& c = choice(out.index);
    const bool was_done = c.done;
    if (!c.ending && !was_done) {
        // An end token (EOS or a stop token id: the core's finish "stop") adds no text.
        const size_t texted = out.finish == FinishReason::Stop && !out.token_ids.empty() ? out.token_ids.size() - 1
                                                                                         : out.token_ids.size();
        for (size_t i = 0; i < texted; ++i) {
            std::string stop;
            out.text += c.text->push(out.token_ids[i], &stop);
            if (stop.empty()) continue;
            // The choice ends at token i: what follows it never reaches the consumer.
            out.token_ids.resize(i + 1);
            if (out.logprobs.size() > i + 1) out.logprobs.resize(i + 1);
            c.delivered += static_cast<int>(i + 1);
            c.ending = out;
            c.ending->finish = FinishReason::Stop;
            c.ending->stop_reason = std::move(stop);
            *stopped = out.index;
            break;
        }
        if (!c.ending) {
            c.delivered += static_cast<int>(out.token_ids.size());
            if (out.finish != FinishReason::None) {
                // Text held back (an incomplete character, a possible stop string's start) is
                // released, except after a stop token id, which ends the text where it stands.
                if (out.finish != FinishReason::Stop || out.stop_reason.empty()) out.text += c.text->flush();
                c.text.reset();
                c.done = true;
            }
        }
    }
    if (c.ending) {
        if (out.finish == FinishReason::None) return false;  // drawn after the stop string: dropped
        // The core has ended the choice (confirming, or by EOS / length at the same time):
        // the held output goes out with the request's usage and timing, if this is its last.
        std::optional<Usage> usage = std::move(out.usage);
        std::optional<RequestTiming> timing = std::move(out.timing);
        out = std::move(*c.ending);
        out.usage = std::move(usage);
        out.timing = std::move(timing);
        c.ending.reset();  // the held tokens were counted in `delivered` when held
        c.text.reset();
        c.done = true;
    } else if (was_done) {
        return false;  // nothing follows a choice's last output
    }
    if (out.usage) {
        int delivered = 0, longest = 0;
        for (const Choice& ch : choices_) {
            delivered += ch.delivered;
            longest = std::max(longest, ch.delivered);
        }
        out.usage->completion_tokens = delivered;
        out.usage->max_choice_tokens = longest;
    }
    return true;
}

}  // namespace peregrine
