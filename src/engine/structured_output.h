// Structured output on the engine side: a request's StructuredOutput compiled, once, into a
// grammar over the tokenizer's vocabulary (src/grammar), and the per-sequence matcher that
// masks each draw. Compiling runs on the submitting thread (Engine::submit), never on the
// engine thread; compiled grammars are cached by (kind, spec), so a schema that every request
// of an agent repeats is compiled and tokenized once (its token-mask cache fills as it is used).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/token_cache.h"
#include "peregrine/engine_types.h"

namespace peregrine {

class Tokenizer;

class GrammarCache {
  public:
    // `eos_ids`: the ids that end a sequence (allowed exactly when the grammar is complete).
    // The tokenizer must outlive the cache.
    GrammarCache(const Tokenizer& tokenizer, std::vector<int32_t> eos_ids, size_t capacity = 64);

    // The compiled grammar of `s` (kind != None). Throws Error naming s.field and the reason
    // ("'response_format' json_schema: unsupported keyword 'not' at /properties/a").
    std::shared_ptr<const grammar::TokenizedGrammar> get(const StructuredOutput& s);

  private:
    std::shared_ptr<const grammar::VocabIndex> vocab();  // built on first use (mu_ held)

    const Tokenizer& tokenizer_;
    std::vector<int32_t> eos_ids_;
    size_t capacity_;
    std::mutex mu_;
    std::shared_ptr<const grammar::VocabIndex> vocab_;
    using Entry = std::pair<std::string, std::shared_ptr<const grammar::TokenizedGrammar>>;
    std::list<Entry> lru_;  // most recent first
    std::unordered_map<std::string, std::list<Entry>::iterator> where_;
};

}  // namespace peregrine
