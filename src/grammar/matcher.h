// One generation's grammar state: feed it the sampled tokens, ask it for the next step's
// allowed-token bitmask. Not thread-safe (one per sequence); many matchers may share one
// TokenizedGrammar across threads.
//
// Mask: bit i of word i/32 set = token i allowed. Built as the union over the parser's tops of
// each top node's cached accepted tokens, plus the cached uncertain tokens that the full parser
// state accepts (checked in byte order, re-using the parser steps of the common prefix with the
// previous checked token). Special tokens are never allowed; EOS ids exactly when the input so
// far is a complete sentence of the grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/parser.h"
#include "grammar/token_cache.h"

namespace peregrine::grammar {

class GrammarMatcher {
  public:
    explicit GrammarMatcher(std::shared_ptr<const TokenizedGrammar> g);

    // Accepts the token and returns true when the grammar allows it; else returns false and the
    // state is unchanged. An EOS id is allowed when is_completed(); it terminates the matcher.
    bool accept_token(int32_t id);
    // Accepts raw bytes (forced text, tests); all or nothing. Counts as one token for rollback.
    bool accept_string(std::string_view bytes);
    // Writes the allowed-token mask: `mask` has vocab().mask_words() words.
    void fill_next_token_bitmask(std::span<uint32_t> mask);
    // Undoes the last `num_tokens` accepted tokens (EOS included); false if fewer were accepted.
    bool rollback(size_t num_tokens);
    void reset();

    // The input so far is a complete sentence: EOS is allowed now.
    bool is_completed() const { return !terminated_ && parser_.at_end(); }
    // EOS was accepted; nothing more is.
    bool is_terminated() const { return terminated_; }
    // No further byte can be accepted (complete, only EOS remains).
    bool can_only_end() const { return parser_.tops().empty(); }
    size_t num_accepted_tokens() const { return history_.size(); }

  private:
    std::shared_ptr<const TokenizedGrammar> g_;
    Parser parser_;
    std::vector<size_t> history_;  // parser steps before each accepted token
    bool terminated_ = false;
    std::vector<uint32_t> candidates_;  // scratch: uncertain trie nodes of this step
};

}  // namespace peregrine::grammar
