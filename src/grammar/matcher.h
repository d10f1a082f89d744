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
#include <utility>
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
    //
    // `tokens_left`: the draws the budget still allows, this one included (max_tokens minus the
    // tokens so far). A token is then allowed only when what completes the sentence after it
    // still fits: its shortest completion in bytes (an upper bound on tokens: every byte is a
    // token in byte-level vocabularies), plus the EOS, within tokens_left - 1; the EOS itself
    // whenever the sentence is complete. So a sentence that could fit when the budget started
    // always ends (EOS) within it. Where every allowed token fits (checked per parser top from
    // the token cache's largest need, then per uncertain token) the mask is exactly the
    // unbudgeted one; else it is rebuilt token by token. When no token fits (the budget was
    // below the shortest sentence), the tokens of the least need are allowed: the shortest way
    // on. Returns whether the budget removed tokens from the mask.
    static constexpr int64_t kNoBudget = INT64_MAX;
    bool fill_next_token_bitmask(std::span<uint32_t> mask, int64_t tokens_left = kNoBudget);
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
    // Checks candidates_ against the whole state in byte order: sets the ids of each token the
    // state accepts whose completion after it needs at most `limit` bytes (skipping tokens
    // already set when `skip_set`); `need_range` (if set) gets the least and largest such need
    // of every accepted token.
    void check_candidates(std::span<uint32_t> mask, bool skip_set, int64_t limit,
                          std::pair<int64_t, int64_t>* need_range);
    // The budgeted mask: EOS when complete, and each token whose need after it is at most
    // `limit` bytes. Returns whether any token other than EOS is set.
    bool fill_within(std::span<uint32_t> mask, int64_t limit);

    std::vector<uint32_t> candidates_;  // scratch: uncertain trie nodes of this step
    std::vector<uint32_t> scratch_;     // scratch mask for fill_within
};

}  // namespace peregrine::grammar
