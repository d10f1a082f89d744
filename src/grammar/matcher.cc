#include "grammar/matcher.h"

#include <algorithm>

#include "core/error.h"

namespace peregrine::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const TokenizedGrammar> g) : g_(std::move(g)), parser_(g_->grammar()) {}

void GrammarMatcher::reset() {
    parser_.reset(g_->grammar().rule_start[size_t(g_->grammar().root)]);
    history_.clear();
    terminated_ = false;
}

bool GrammarMatcher::accept_token(int32_t id) {
    const Vocabulary& v = g_->vocab().vocab;
    if (terminated_ || id < 0 || size_t(id) >= v.size()) return false;
    if (std::find(v.eos.begin(), v.eos.end(), id) != v.eos.end()) {
        if (!parser_.at_end()) return false;
        history_.push_back(parser_.num_steps());
        terminated_ = true;
        return true;
    }
    if (!v.special.empty() && v.special[size_t(id)]) return false;
    if (v.tokens[size_t(id)].empty()) return false;
    return accept_string(v.tokens[size_t(id)]);
}

bool GrammarMatcher::accept_string(std::string_view bytes) {
    if (terminated_) return false;
    size_t before = parser_.num_steps();
    for (char c : bytes) {
        if (!parser_.advance(uint8_t(c))) {
            parser_.truncate(before);
            return false;
        }
    }
    history_.push_back(before);
    return true;
}

bool GrammarMatcher::rollback(size_t num_tokens) {
    if (num_tokens > history_.size()) return false;
    if (num_tokens == 0) return true;
    size_t steps = history_[history_.size() - num_tokens];
    history_.resize(history_.size() - num_tokens);
    parser_.truncate(steps);
    terminated_ = false;
    return true;
}

namespace {

void set_bit(std::span<uint32_t> mask, int32_t id) {
    mask[size_t(id) >> 5] |= 1u << (id & 31);
}

void or_accepted(std::span<uint32_t> mask, const NodeTokens& nt) {
    if (!nt.accepted_bits.empty()) {
        const uint32_t* src = nt.accepted_bits.data();
        uint32_t* dst = mask.data();
        for (size_t w = 0, n = nt.accepted_bits.size(); w < n; ++w) dst[w] |= src[w];
    } else {
        for (int32_t id : nt.accepted_ids) set_bit(mask, id);
    }
}

bool has_accepted(const NodeTokens& nt) {
    return !nt.accepted_bits.empty() || !nt.accepted_ids.empty();
}

}  // namespace

bool GrammarMatcher::fill_next_token_bitmask(std::span<uint32_t> mask, int64_t tokens_left) {
    const VocabIndex& vi = g_->vocab();
    PG_CHECK(mask.size() >= vi.vocab.mask_words(), "mask of ", mask.size(), " words, need ", vi.vocab.mask_words());
    std::fill(mask.begin(), mask.end(), 0u);
    if (terminated_) return false;
    if (parser_.at_end())
        for (int32_t id : vi.vocab.eos) set_bit(mask, id);
    // After this draw tokens_left - 1 remain, one of them for the EOS: a token's completion may
    // need `room` bytes.
    const bool budget = tokens_left != kNoBudget;
    const int64_t room = std::max<int64_t>(tokens_left, 1) - 2;
    bool tight = false;

    // Distinct top nodes: their cached accepted sets, and the uncertain tokens to check.
    std::span<const Top> tops = parser_.tops();
    candidates_.clear();
    size_t lists = 0;
    int32_t last_node = -1;
    for (size_t i = 0; i < tops.size(); ++i) {
        int32_t node = tops[i].node;
        if (budget && !tight) {  // an accepted token's need, read from this top, is at most this
            const NodeTokens& nt = g_->node_tokens(node);
            tight = has_accepted(nt) && int64_t(nt.need_max) + parser_.frame_need(tops[i].frame) > room;
        }
        if (node == last_node) continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; ++j) seen = tops[j].node == node;
        if (seen) continue;
        last_node = node;
        const NodeTokens& nt = g_->node_tokens(node);
        or_accepted(mask, nt);
        candidates_.insert(candidates_.end(), nt.uncertain.begin(), nt.uncertain.end());
        ++lists;
    }
    if (lists > 1) {
        std::sort(candidates_.begin(), candidates_.end());
        candidates_.erase(std::unique(candidates_.begin(), candidates_.end()), candidates_.end());
    }
    std::pair<int64_t, int64_t> range{kNoCompletion, -1};
    check_candidates(mask, true, kNoBudget, budget && !tight ? &range : nullptr);
    if (!budget || (!tight && range.second <= room)) return false;

    // Near the end of the budget: token by token.
    std::vector<uint32_t> full(mask.begin(), mask.end());
    if (!fill_within(mask, room) && !parser_.at_end()) {
        // No token fits (the budget was below the shortest sentence): the least need instead.
        int64_t least = kNoCompletion;
        for (const Top& t : tops) {
            const NodeTokens& nt = g_->node_tokens(t.node);
            if (has_accepted(nt)) least = std::min<int64_t>(least, int64_t(nt.need_min) + parser_.frame_need(t.frame));
        }
        std::fill(mask.begin(), mask.end(), 0u);
        range = {kNoCompletion, -1};
        check_candidates(mask, false, -1, &range);
        least = std::min(least, range.first);
        fill_within(mask, least);
    }
    return !std::equal(full.begin(), full.end(), mask.begin());
}

bool GrammarMatcher::fill_within(std::span<uint32_t> mask, int64_t limit) {
    const VocabIndex& vi = g_->vocab();
    std::fill(mask.begin(), mask.end(), 0u);
    std::span<const Top> tops = parser_.tops();
    bool any = false;
    for (size_t i = 0; i < tops.size(); ++i) {
        const int32_t node = tops[i].node;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; ++j) seen = tops[j].node == node;
        if (seen) continue;
        // The shallowest stack among the tops at this node: its tokens need the least.
        int64_t frame_need = parser_.frame_need(tops[i].frame);
        for (size_t j = i + 1; j < tops.size(); ++j)
            if (tops[j].node == node) frame_need = std::min<int64_t>(frame_need, parser_.frame_need(tops[j].frame));
        const NodeTokens& nt = g_->node_tokens(node);
        if (!has_accepted(nt)) continue;
        const int64_t k = limit - frame_need;
        if (k >= nt.need_max) {
            or_accepted(mask, nt);
            any = true;
        } else if (k >= nt.need_common) {  // all but the tokens that need more than k
            scratch_.assign(mask.size(), 0u);
            or_accepted(scratch_, nt);
            for (auto it = nt.need_other.rbegin(); it != nt.need_other.rend() && it->first > k; ++it)
                scratch_[size_t(it->second) >> 5] &= ~(1u << (it->second & 31));
            for (size_t w = 0; w < mask.size(); ++w) mask[w] |= scratch_[w];
            any = true;
        } else {  // only the (rarer) tokens that need less than the common need
            for (auto it = nt.need_other.begin(); it != nt.need_other.end() && it->first <= k; ++it) {
                set_bit(mask, it->second);
                any = true;
            }
        }
    }
    std::pair<int64_t, int64_t> range{kNoCompletion, -1};
    check_candidates(mask, false, limit, &range);
    any = any || range.first <= limit;
    if (parser_.at_end())
        for (int32_t id : vi.vocab.eos) set_bit(mask, id);
    return any;
}

// Checks the uncertain tokens against the whole state, in byte order. `prev`'s first `consumed`
// bytes are on the parser past `base`; if it died, its prefix of length dead + 1 is dead for
// every later token that shares it.
void GrammarMatcher::check_candidates(std::span<uint32_t> mask, bool skip_set, int64_t limit,
                                      std::pair<int64_t, int64_t>* need_range) {
    const TokenTrie& trie = g_->vocab().trie;
    const size_t base = parser_.num_steps();
    const std::string* prev = nullptr;
    size_t consumed = 0;
    size_t dead = SIZE_MAX;
    for (uint32_t node : candidates_) {
        const TokenTrie::TrieNode& tn = trie.nodes[node];
        int32_t first = trie.ids[tn.id_begin];
        if (skip_set && (mask[size_t(first) >> 5] >> (first & 31) & 1)) continue;  // already accepted by a cache
        const std::string& s = trie.text(node);
        size_t lcp = 0;
        if (prev)
            while (lcp < prev->size() && lcp < s.size() && (*prev)[lcp] == s[lcp]) ++lcp;
        if (dead != SIZE_MAX && lcp > dead) continue;  // shares a dead prefix
        size_t keep = std::min(lcp, consumed);
        parser_.truncate(base + keep);
        consumed = keep;
        dead = SIZE_MAX;
        prev = &s;
        for (; consumed < s.size(); ++consumed) {
            if (!parser_.advance(uint8_t(s[consumed]))) {
                dead = consumed;
                break;
            }
        }
        if (dead != SIZE_MAX) continue;
        if (need_range || limit != kNoBudget) {
            const int64_t need = parser_.completion_bytes();
            if (need_range) {
                need_range->first = std::min(need_range->first, need);
                need_range->second = std::max(need_range->second, need);
            }
            if (need > limit) continue;
        }
        for (uint32_t k = tn.id_begin; k < tn.id_end; ++k) set_bit(mask, trie.ids[k]);
    }
    parser_.truncate(base);
}

}  // namespace peregrine::grammar
