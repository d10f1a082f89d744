// Pre-tokenization: cutting normalized text into words before BPE, with a sequence of
// PCRE2 regexes (UTF mode, Unicode properties, JIT), the way Hugging Face's `Split`
// pre-tokenizers and llama.cpp's `tokenizer.ggml.pre` families do.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

// What happens to the text a regex matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior {
    Isolated,            // matches and the gaps between them are all pieces
    Removed,             // gaps are pieces, matches are dropped
    MergedWithPrevious,  // a match ends the piece before it
    MergedWithNext,      // a match starts the piece after it
    Contiguous,          // like Isolated, with adjacent matches joined
};

struct SplitRule {
    std::string pattern;  // PCRE2 syntax
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;  // the gaps are the delimiters
};

// A sequence of split rules: rule k cuts every piece rule k-1 produced. Thread-safe (each
// call uses its own match data).
class RegexSplitter {
  public:
    RegexSplitter() = default;
    // Compiles every rule; throws Error naming `where` and the pattern when one does not
    // compile.
    RegexSplitter(std::vector<SplitRule> rules, const std::string& where);
    ~RegexSplitter();
    RegexSplitter(RegexSplitter&&) noexcept;
    RegexSplitter& operator=(RegexSplitter&&) noexcept;

    bool empty() const { return rules_.empty(); }
    size_t size() const { return rules_.size(); }
    const SplitRule& rule(size_t i) const { return rules_[i].rule; }

    // Appends the pieces of `text` (valid UTF-8) to `out` as views into `text`; empty pieces
    // are never produced.
    void split(std::string_view text, std::vector<std::string_view>& out) const;

  private:
    struct Compiled;
    struct Scratch;
    void split_level(size_t level, std::string_view s, std::vector<std::string_view>& out, Scratch& sc) const;

    struct Entry {
        SplitRule rule;
        void* code = nullptr;  // pcre2_code_8*
        bool jit = false;
    };
    std::vector<Entry> rules_;
};

// The split rules of llama.cpp's pre-tokenizer families (`tokenizer.ggml.pre`: "llama-bpe",
// "qwen2", "gpt-2", "deepseek-coder", ...). Sets *ignore_merges for the families whose
// words found whole in the vocabulary skip BPE (Llama 3). Throws Error for an unknown name.
std::vector<SplitRule> gguf_pre_tokenizer_rules(const std::string& pre, bool* ignore_merges);

// GPT-2's split regex, used by a Hugging Face ByteLevel pre-tokenizer with use_regex.
extern const char* const kGpt2SplitRegex;

}  // namespace peregrine
