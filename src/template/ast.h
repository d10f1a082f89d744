// The syntax tree of a parsed Jinja template: expressions and statements.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"

namespace peregrine::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    enum class Kind : uint8_t {
        Literal,  // value
        Name,     // name
        List,     // args: elements
        Tuple,    // args: elements
        Dict,     // args: key, value, key, value, ...
        Unary,    // name: "not" | "-" | "+"; args[0]
        Binary,   // name: operator ("and", "or", "+", "~", "//", ...); args[0], args[1]
        Compare,  // args[0] ops[0] args[1] ops[1] args[2] ... (chained as in Python)
        GetAttr,  // args[0].name
        GetItem,  // args[0][args[1]]
        Slice,    // args[0][args[1]:args[2]:args[3]], missing parts are null
        Call,     // args[0](args[1..], kwargs)
        Filter,   // args[0] | name(args[1..], kwargs)
        Test,     // args[0] is [not] name(args[1..]); negated
        Cond,     // args[1] if args[0] else args[2] (args[2] may be null)
    };

    Kind kind;
    uint32_t offset = 0;  // in the source, for error messages
    std::string name;
    Value value;
    std::vector<ExprPtr> args;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    std::vector<std::string> ops;  // Compare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
    bool negated = false;          // Test
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
    enum class Kind : uint8_t {
        Text,         // text
        Output,       // {{ expr }}
        If,           // branches: (condition, body)...; a null condition is the else branch
        For,          // for targets in expr [if cond]: body [else else_body]
        Set,          // set targets = expr, or set targets[0].attr = expr
        SetBlock,     // set targets[0] [| filter] %}body{% endset
        Macro,        // macro text(params) body
        CallBlock,    // call(params) expr: body is `caller`
        FilterBlock,  // filter expr(args): body; expr is a Filter whose operand is null
        Break,
        Continue,
        Do,     // do expr
        With,   // with targets = values: body (params hold the assignments)
        Scope,  // a body rendered in place (the transformers `generation` block)
    };

    Kind kind;
    uint32_t offset = 0;
    std::string text;  // Text: the text; Macro: its name
    ExprPtr expr;      // Output, For (iterable), Set, CallBlock (the call), Do, FilterBlock / SetBlock filter
    ExprPtr cond;      // For: the inline `if`
    std::vector<std::string> targets;                     // For, Set, SetBlock: names (more than one: tuple unpacking)
    std::string attr;                                     // Set: `set ns.attr = ...`
    std::vector<std::pair<ExprPtr, Body>> branches;       // If
    std::vector<std::pair<std::string, ExprPtr>> params;  // Macro, CallBlock: (name, default or null); With
    Body body;
    Body else_body;
};

struct Program {
    Body body;
};

}  // namespace peregrine::jinja
