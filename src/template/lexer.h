// Jinja lexer: splits a template into text and tag tokens, applying whitespace control
// (`{%-`, `-%}`, `{{-`, `-}}`, `{#- -#}`), `trim_blocks`/`lstrip_blocks` (on, as transformers
// renders chat templates) and `{% raw %}`; tokenises expressions inside the tags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine::jinja {

enum class Tok : uint8_t {
    Text,        // literal template text (value)
    VarBegin,    // {{
    VarEnd,      // }}
    BlockBegin,  // {%
    BlockEnd,    // %}
    Name,        // identifier or keyword (value)
    String,      // string literal, escapes resolved (value)
    Int,         // value holds the digits
    Float,       // value holds the literal
    Op,          // operator or punctuation (value): + - * / // % ** ~ | . , : ( ) [ ] { } = == != < > <= >=
    Eof,
};

struct Token {
    Tok type;
    std::string value;
    uint32_t offset;  // byte offset of the token in the source
};

struct LexOptions {
    bool trim_blocks = true;    // drop the first newline after a block tag or comment
    bool lstrip_blocks = true;  // drop spaces and tabs before a block tag or comment at a line's start
};

// Thrown by tokenize(); the parser turns it into an Error naming the template, line and column.
struct LexError {
    std::string message;
    uint32_t offset;
};

std::vector<Token> tokenize(std::string_view source, const LexOptions& opt = {});

// Line and column (1-based) of a byte offset.
std::pair<int, int> line_col(std::string_view source, uint32_t offset);

}  // namespace peregrine::jinja
