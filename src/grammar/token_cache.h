// A compiled grammar bound to a vocabulary, with the per-node token cache that makes the
// allowed-token mask cheap (xgrammar's adaptive token mask cache, rebuilt our way).
//
// For a parser top at node n, walking the vocabulary trie from n alone (on an empty caller
// stack, calls into sub-rules included) sorts every token into one of three classes:
//   accepted:  some path reads all its bytes inside n's rule (or ends exactly where the rule
//              completes) - allowed whatever the callers are;
//   rejected:  every path dies inside the rule, or leaves it into a byte outside the rule's
//              FOLLOW set - never allowed;
//   uncertain: some path completes the rule with bytes left over that FOLLOW admits - only
//              the real caller stack can tell; the matcher checks these one by one.
// Grammars from JSON Schema inline everything but recursion, so most positions leave few
// uncertain tokens. Entries are computed on first use (one trie walk each) and shared by every
// matcher of the grammar, from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/vocabulary.h"

namespace peregrine::grammar {

struct NodeTokens {
    // Accepted tokens as a bitmask (mask_words words) when many, else as a sorted id list.
    std::vector<uint32_t> accepted_bits;
    std::vector<int32_t> accepted_ids;
    std::vector<uint32_t> uncertain;  // trie nodes, ascending (= byte order)
    // Per accepted token, its need: the fewest bytes that complete the node's rule after it
    // (0 when the token ends where the rule completes). A top (node, stack) that reads the token
    // then needs that plus its stack's frame_need: what the matcher checks a token budget
    // against. Stored as the most common need, the largest and the smallest, and the accepted
    // tokens whose need differs from the common one, as (need, id) by need ascending.
    int32_t need_common = 0, need_max = 0, need_min = 0;
    std::vector<std::pair<int32_t, int32_t>> need_other;
};

class TokenizedGrammar {
  public:
    TokenizedGrammar(CompiledGrammar g, std::shared_ptr<const VocabIndex> vocab);

    const CompiledGrammar& grammar() const { return grammar_; }
    const VocabIndex& vocab() const { return *vocab_; }
    // The cache entry of a node with byte edges; computed on first use.
    const NodeTokens& node_tokens(int32_t node) const;
    // Computes every entry now (else the first mask at a new position pays one trie walk).
    void precompute() const;

  private:
    std::unique_ptr<NodeTokens> compute(int32_t node) const;

    CompiledGrammar grammar_;
    std::shared_ptr<const VocabIndex> vocab_;
    mutable std::mutex mutex_;
    mutable std::vector<std::unique_ptr<NodeTokens>> owned_;
    mutable std::unique_ptr<std::atomic<const NodeTokens*>[]> entries_;
};

}  // namespace peregrine::grammar
