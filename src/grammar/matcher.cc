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

void GrammarMatcher::fill_next_token_bitmask(std::span<uint32_t> mask) {
    const VocabIndex& vi = g_->vocab();
    PG_CHECK(mask.size() >= vi.vocab.mask_words(), "mask of ", mask.size(), " words, need ", vi.vocab.mask_words());
    std::fill(mask.begin(), mask.end(), 0u);
    if (terminated_) return;
    if (parser_.at_end())
        for (int32_t id : vi.vocab.eos) mask[size_t(id) >> 5] |= 1u << (id & 31);

    // Distinct top nodes: their cached accepted sets, and the uncertain tokens to check.
    std::span<const Top> tops = parser_.tops();
    candidates_.clear();
    size_t lists = 0;
    int32_t last_node = -1;
    for (size_t i = 0; i < tops.size(); ++i) {
        int32_t node = tops[i].node;
        if (node == last_node) continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; ++j) seen = tops[j].node == node;
        if (seen) continue;
        last_node = node;
        const NodeTokens& nt = g_->node_tokens(node);
        if (!nt.accepted_bits.empty()) {
            const uint32_t* src = nt.accepted_bits.data();
            uint32_t* dst = mask.data();
            for (size_t w = 0, n = nt.accepted_bits.size(); w < n; ++w) dst[w] |= src[w];
        } else {
            for (int32_t id : nt.accepted_ids) mask[size_t(id) >> 5] |= 1u << (id & 31);
        }
        candidates_.insert(candidates_.end(), nt.uncertain.begin(), nt.uncertain.end());
        ++lists;
    }
    if (lists > 1) {
        std::sort(candidates_.begin(), candidates_.end());
        candidates_.erase(std::unique(candidates_.begin(), candidates_.end()), candidates_.end());
    }

    // Check the uncertain tokens against the whole state, in byte order. `prev`'s first
    // `consumed` bytes are on the parser past `base`; if it died, its prefix of length
    // dead + 1 is dead for every later token that shares it.
    const TokenTrie& trie = vi.trie;
    const size_t base = parser_.num_steps();
    const std::string* prev = nullptr;
    size_t consumed = 0;
    size_t dead = SIZE_MAX;
    for (uint32_t node : candidates_) {
        const TokenTrie::TrieNode& tn = trie.nodes[node];
        int32_t first = trie.ids[tn.id_begin];
        if (mask[size_t(first) >> 5] >> (first & 31) & 1) continue;  // already accepted by a cache
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
        if (dead == SIZE_MAX)
            for (uint32_t k = tn.id_begin; k < tn.id_end; ++k)
                mask[size_t(trie.ids[k]) >> 5] |= 1u << (trie.ids[k] & 31);
    }
    parser_.truncate(base);
}

}  // namespace peregrine::grammar
