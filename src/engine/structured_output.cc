#include "engine/structured_output.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/automaton.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "tokenizer/tokenizer.h"

namespace peregrine {

namespace {

const char* kind_name(StructuredOutput::Kind k) {
    switch (k) {
        case StructuredOutput::Kind::JsonObject:
            return "json_object";
        case StructuredOutput::Kind::JsonSchema:
            return "json_schema";
        case StructuredOutput::Kind::Regex:
            return "regex";
        case StructuredOutput::Kind::Choice:
            return "choice";
        case StructuredOutput::Kind::Grammar:
            return "grammar";
        case StructuredOutput::Kind::None:
            break;
    }
    return "none";
}

grammar::JsonSchemaOptions json_options(const StructuredOutput& s) {
    grammar::JsonSchemaOptions o;
    if (s.compact) o.max_whitespace = 0;
    return o;
}

grammar::Grammar front_end(const StructuredOutput& s) {
    using Kind = StructuredOutput::Kind;
    switch (s.kind) {
        case Kind::JsonObject:
            return grammar::compile_any_json_object(json_options(s));
        case Kind::JsonSchema:
            return grammar::compile_json_schema_text(s.spec, json_options(s));
        case Kind::Regex:
            return grammar::compile_regex(s.spec);
        case Kind::Grammar:
            return grammar::compile_gbnf(s.spec);
        case Kind::Choice: {
            const nlohmann::json j = nlohmann::json::parse(s.spec, nullptr, false);
            if (!j.is_array() || j.empty()) fail("the choices must be a non-empty list of strings");
            std::vector<std::string> choices;
            for (const auto& c : j) {
                if (!c.is_string()) fail("the choices must be a non-empty list of strings");
                choices.push_back(c.get<std::string>());
            }
            return grammar::compile_choice(choices);
        }
        case Kind::None:
            break;
    }
    fail("no structured output asked for");
}

}  // namespace

GrammarCache::GrammarCache(const Tokenizer& tokenizer, std::vector<int32_t> eos_ids, size_t capacity)
    : tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)), capacity_(capacity) {}

std::shared_ptr<const grammar::VocabIndex> GrammarCache::vocab() {
    if (vocab_) return vocab_;
    grammar::Vocabulary v;
    const int32_t n = tokenizer_.size();
    v.tokens.resize(static_cast<size_t>(n));
    v.special.resize(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
        v.special[static_cast<size_t>(id)] = tokenizer_.is_special(id);
        if (!tokenizer_.is_special(id)) v.tokens[static_cast<size_t>(id)] = tokenizer_.piece(id);
    }
    for (int32_t id : eos_ids_)
        if (id >= 0 && id < n) v.eos.push_back(id);
    vocab_ = std::make_shared<const grammar::VocabIndex>(std::move(v));
    return vocab_;
}

std::shared_ptr<const grammar::TokenizedGrammar> GrammarCache::get(const StructuredOutput& s) {
    const std::string key = std::string(kind_name(s.kind)) + (s.compact ? " compact" : "") + '\n' + s.spec;
    std::lock_guard lock(mu_);  // compiles are rare and bounded (the grammar layer's caps)
    if (auto it = where_.find(key); it != where_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
    }
    std::shared_ptr<const grammar::TokenizedGrammar> g;
    try {
        g = std::make_shared<const grammar::TokenizedGrammar>(grammar::compile_grammar(front_end(s)), vocab());
    } catch (const Error& e) {
        fail("'", s.field, "' ", kind_name(s.kind), ": ", e.what());
    }
    lru_.emplace_front(key, g);
    where_[key] = lru_.begin();
    if (lru_.size() > capacity_) {
        where_.erase(lru_.back().first);
        lru_.pop_back();
    }
    return g;
}

}  // namespace peregrine
