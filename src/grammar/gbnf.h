// GBNF (llama.cpp's grammar format; vLLM's `guided_grammar`) compiled into a Grammar.
//
//   rule-name ::= alternatives          # comment
//   alternatives: sequences separated by |; a sequence of items, each optionally followed by
//   * + ? {m} {m,} {m,n}; items: "literal", [class] / [^class] (ranges, escapes), rule-name,
//   ( alternatives ), . (any character).
// Escapes in literals and classes: \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH. A rule may
// span lines; it ends where the next `name ::=` begins. The start rule is `root`. Refused with
// an Error naming the place: syntax errors, undefined or duplicate rules, a missing root, left
// recursion (at compile time, as llama.cpp does).
#pragma once

#include <string_view>

#include "grammar/grammar.h"

namespace peregrine::grammar {

Grammar compile_gbnf(std::string_view text);

}  // namespace peregrine::grammar
