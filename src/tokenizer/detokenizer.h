// Streaming output: token ids → text deltas that never end inside a UTF-8 character, and a
// stop-string matcher that holds back only what could still begin a stop string.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

class Tokenizer;

// Feeds token ids one at a time and hands out text as soon as it is whole characters.
// Joining every push() and the finish() gives exactly Tokenizer::decode(ids, skip_special):
// byte-fallback and byte-level pieces are joined into characters, ill-formed bytes become
// U+FFFD, and SentencePiece's leading space is dropped from the start of the stream.
class IncrementalDetokenizer {
  public:
    explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = true);

    // The text completed by token `id` (often empty while a character is cut). Throws Error
    // for an id outside the vocabulary.
    std::string push(int32_t id);
    void push(int32_t id, std::string& out);  // appends to `out`
    // Tokens whose text is already known (a prompt, when only the continuation is streamed):
    // they set the stream's position (no leading-space drop afterwards) but emit nothing.
    void prime(std::span<const int32_t> ids);
    // The end of the stream: bytes still held (a cut character) come out as U+FFFD.
    std::string finish();

    size_t held_bytes() const { return pending_.size(); }

  private:
    const Tokenizer& tok_;
    bool skip_special_;
    bool at_start_ = true;
    std::string pending_;  // the start of a character whose bytes have not all arrived
};

// Watches streamed text for stop strings. push() returns the text that can be shown now:
// everything up to a stop string when one is found (the stop string itself is never shown),
// otherwise everything except the longest tail that could still grow into a stop string.
// The stream ends at the first push that completes a stop string; when several are complete
// by then, the one that starts first wins (a longer one still incomplete does not count).
class StopMatcher {
  public:
    explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

    struct Result {
        std::string emit;      // show this
        bool matched = false;  // a stop string was found: the stream ends here
        int stop_index = -1;   // which one (an index into the constructor's list)
    };
    Result push(std::string_view text);
    // The end of the stream without a match: the held-back text.
    std::string flush();

    bool matched() const { return matched_; }
    size_t held_bytes() const { return held_.size(); }

  private:
    std::vector<std::string> stops_;
    std::vector<int> index_;  // stops_[i] is the constructor's stops[index_[i]]
    std::string held_;
    bool matched_ = false;
};

}  // namespace peregrine
