#include "tokenizer/detokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace peregrine {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tok_(tokenizer), skip_special_(skip_special) {}

void IncrementalDetokenizer::push(int32_t id, std::string& out) {
    if (!tok_.valid_id(id)) fail("token id ", id, " is outside the vocabulary (0..", tok_.size() - 1, ")");
    if (skip_special_ && tok_.is_special(id)) return;
    std::string_view piece = tok_.piece(id);
    if (piece.empty()) return;
    if (at_start_) {
        at_start_ = false;
        if (tok_.strips_leading_space() && piece[0] == ' ') piece.remove_prefix(1);
    }
    pending_ += piece;
    utf8::take_complete(pending_, out);
}

std::string IncrementalDetokenizer::push(int32_t id) {
    std::string out;
    push(id, out);
    return out;
}

void IncrementalDetokenizer::prime(std::span<const int32_t> ids) {
    std::string sink;
    for (int32_t id : ids) push(id, sink);
    pending_.clear();
}

std::string IncrementalDetokenizer::finish() {
    std::string out;
    utf8::take_complete(pending_, out, true);
    return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
    for (size_t i = 0; i < stops.size(); ++i) {
        if (stops[i].empty()) continue;
        stops_.push_back(std::move(stops[i]));
        index_.push_back(static_cast<int>(i));
    }
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
    Result r;
    if (matched_) return r;
    held_ += text;
    // The earliest stop string in the text (held text included: a stop may straddle pushes).
    size_t best = std::string::npos;
    int which = -1;
    for (size_t i = 0; i < stops_.size(); ++i) {
        const size_t p = held_.find(stops_[i]);
        if (p < best) {
            best = p;
            which = static_cast<int>(i);
        }
    }
    if (which >= 0) {
        matched_ = true;
        r.matched = true;
        r.stop_index = index_[which];
        r.emit = held_.substr(0, best);
        held_.clear();
        return r;
    }
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const std::string& s : stops_) {
        for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    r.emit = held_.substr(0, held_.size() - hold);
    held_.erase(0, held_.size() - hold);
    return r;
}

std::string StopMatcher::flush() {
    if (matched_) return {};
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace peregrine
