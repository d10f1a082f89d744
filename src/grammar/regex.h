// Regular expressions (vLLM's `guided_regex`, JSON Schema `pattern`) compiled into a Grammar.
//
// Supported (ECMAScript syntax, no flags): literals (UTF-8), escapes \n \t \r \f \v \0 \xHH
// \uHHHH \u{H...} and escaped punctuation, classes [...] / [^...] with ranges and \d \w \s
// (\D \W \S too), `.` (any character but line terminators), groups ( ) (?: ) (?<name> ),
// alternation |, quantifiers ? * + {m} {m,} {m,n} (a lazy `?` after them is accepted and
// means the same here), ^ at the very start and $ at the very end (the match is always of the
// whole text, so both are no-ops). Refused with an Error naming the construct: backreferences,
// lookaround, word boundaries \b \B, unicode property escapes \p, possessive quantifiers,
// anchors elsewhere.
#pragma once

#include <string_view>

#include "grammar/grammar.h"

namespace peregrine::grammar {

struct RegexOptions {
    // Characters are emitted as they appear inside a JSON string literal: '"' as \", '\' as \\,
    // control characters as their JSON escapes (used for JSON Schema `pattern` and `format`).
    bool json_string = false;
};

// The expression, in `g`, that matches exactly the strings `pattern` matches (whole-text match).
int regex_expr(Grammar& g, std::string_view pattern, const RegexOptions& options = {});

// A grammar whose root is `pattern`.
Grammar compile_regex(std::string_view pattern);

// vLLM's `guided_choice`: exactly one of `choices`.
Grammar compile_choice(const std::vector<std::string>& choices);

}  // namespace peregrine::grammar
