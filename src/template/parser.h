// Jinja parser: tokens -> Program. Syntax errors throw peregrine::Error as
// "<name>:<line>:<column>: <what failed>".
#pragma once

#include <string>
#include <string_view>

#include "template/ast.h"
#include "template/lexer.h"

namespace peregrine::jinja {

// Nesting of blocks and expressions deeper than this is a syntax error (it bounds the recursion of
// the parser and of the evaluator).
inline constexpr int kMaxParseDepth = 200;

Program parse(std::string_view source, std::string_view name, const LexOptions& opt = {});

}  // namespace peregrine::jinja
