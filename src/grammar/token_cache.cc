#include "grammar/token_cache.h"

#include <algorithm>

#include "grammar/parser.h"

namespace peregrine::grammar {

TokenizedGrammar::TokenizedGrammar(CompiledGrammar g, std::shared_ptr<const VocabIndex> vocab)
    : grammar_(std::move(g)), vocab_(std::move(vocab)) {
    entries_ = std::make_unique<std::atomic<const NodeTokens*>[]>(grammar_.nodes.size());
    for (size_t i = 0; i < grammar_.nodes.size(); ++i) entries_[i].store(nullptr, std::memory_order_relaxed);
}

const NodeTokens& TokenizedGrammar::node_tokens(int32_t node) const {
    const NodeTokens* e = entries_[size_t(node)].load(std::memory_order_acquire);
    if (e) return *e;
    std::unique_ptr<NodeTokens> fresh = compute(node);  // outside the lock: walks may run in parallel
    std::lock_guard lock(mutex_);
    e = entries_[size_t(node)].load(std::memory_order_acquire);
    if (e) return *e;
    owned_.push_back(std::move(fresh));
    entries_[size_t(node)].store(owned_.back().get(), std::memory_order_release);
    return *owned_.back();
}

void TokenizedGrammar::precompute() const {
    for (size_t i = 0; i < grammar_.nodes.size(); ++i)
        if (grammar_.has_bytes(int32_t(i))) node_tokens(int32_t(i));
}

// One preorder walk of the trie from `node` on an empty caller stack. Per depth d (bytes read):
// whether the parser still has a step there (`alive`), and whether some path already left the
// rule with the next bytes admissible by FOLLOW (`leaves`), which makes a token uncertain
// rather than rejected if the in-rule paths die.
std::unique_ptr<NodeTokens> TokenizedGrammar::compute(int32_t node) const {
    const TokenTrie& trie = vocab_->trie;
    const ByteSet& follow = grammar_.follow[size_t(grammar_.nodes[size_t(node)].rule)];
    Parser p(grammar_);
    p.reset(node);
    std::vector<char> alive(trie.max_depth + 2, 0), ended(trie.max_depth + 2, 0), leaves(trie.max_depth + 2, 0);
    alive[0] = !p.tops().empty();
    ended[0] = 0;  // leaving at depth 0 is another top's business (the state's closure holds it)
    std::vector<int32_t> accepted;
    std::vector<std::pair<int32_t, int32_t>> needs;  // (need, id) per accepted token
    auto out = std::make_unique<NodeTokens>();
    const auto& nodes = trie.nodes;
    for (uint32_t t = 0; t < nodes.size();) {
        const TokenTrie::TrieNode& tn = nodes[t];
        size_t d = tn.depth;
        bool leave = leaves[d - 1] || (ended[d - 1] && follow.has(tn.byte));
        bool ok = false;
        if (alive[d - 1]) {
            p.truncate(d);  // the step at depth d-1 is the last
            ok = p.advance(tn.byte);
        }
        if (!ok) {
            // The subtree is decided: uncertain if a path left the rule, else rejected.
            if (leave)
                for (uint32_t u = t; u < tn.end; ++u)
                    if (nodes[u].id_end > nodes[u].id_begin) out->uncertain.push_back(u);
            t = tn.end;
            continue;
        }
        alive[d] = !p.tops().empty();
        ended[d] = p.at_end();
        leaves[d] = leave;
        if (tn.id_end > tn.id_begin) {
            const int32_t need = p.completion_bytes();
            for (uint32_t k = tn.id_begin; k < tn.id_end; ++k) {
                accepted.push_back(trie.ids[k]);
                needs.emplace_back(need, trie.ids[k]);
            }
        }
        ++t;
    }
    if (!needs.empty()) {
        std::sort(needs.begin(), needs.end());
        // The most common need: the longest run of equal needs.
        size_t best = 0, best_len = 0;
        for (size_t i = 0, j; i < needs.size(); i = j) {
            for (j = i; j < needs.size() && needs[j].first == needs[i].first;) ++j;
            if (j - i > best_len) best = i, best_len = j - i;
        }
        out->need_common = needs[best].first;
        out->need_min = needs.front().first;
        out->need_max = needs.back().first;
        out->need_other.reserve(needs.size() - best_len);
        for (const auto& e : needs)
            if (e.first != out->need_common) out->need_other.push_back(e);
    }
    const Vocabulary& v = vocab_->vocab;
    if (accepted.size() * 32 > v.size()) {
        out->accepted_bits.assign(v.mask_words(), 0);
        for (int32_t id : accepted) out->accepted_bits[size_t(id) >> 5] |= 1u << (id & 31);
    } else {
        std::sort(accepted.begin(), accepted.end());
        out->accepted_ids = std::move(accepted);
    }
    return out;
}

}  // namespace peregrine::grammar
