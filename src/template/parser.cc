#include "template/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "core/error.h"

namespace peregrine::jinja {

namespace {

// A decimal literal's digits as int64; false when they do not fit (std::stoll would throw a
// non-peregrine exception there, which the fuzzer found).
bool parse_int(const std::string& digits, int64_t& out) {
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return ec == std::errc() && end == digits.data() + digits.size();
}

bool is_keyword(std::string_view s) {
    for (const char* k : {"and", "or", "not", "in", "is", "if", "else", "recursive"})
        if (s == k) return true;
    return false;
}

class Parser {
  public:
    Parser(std::string_view source, std::string_view name, std::vector<Token> tokens)
        : src_(source), name_(name), toks_(std::move(tokens)) {}

    Program run() {
        Program p;
        std::string which;
        p.body = parse_body({}, &which);
        return p;
    }

  private:
    // --- token stream ---
    const Token& cur() const { return toks_[pos_]; }
    const Token& peek(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
    void advance() {
        if (pos_ + 1 < toks_.size()) ++pos_;
    }
    bool is_op(std::string_view op) const { return cur().type == Tok::Op && cur().value == op; }
    bool is_name(std::string_view n) const { return cur().type == Tok::Name && cur().value == n; }
    bool skip_op(std::string_view op) {
        if (!is_op(op)) return false;
        advance();
        return true;
    }
    bool skip_name(std::string_view n) {
        if (!is_name(n)) return false;
        advance();
        return true;
    }

    static std::string describe(const Token& t) {
        switch (t.type) {
            case Tok::Text:
                return "text";
            case Tok::VarBegin:
                return "'{{'";
            case Tok::VarEnd:
                return "'}}'";
            case Tok::BlockBegin:
                return "'{%'";
            case Tok::BlockEnd:
                return "'%}'";
            case Tok::Name:
                return "'" + t.value + "'";
            case Tok::String:
                return "a string";
            case Tok::Int:
            case Tok::Float:
                return "a number";
            case Tok::Op:
                return "'" + t.value + "'";
            case Tok::Eof:
                return "the end of the template";
        }
        return "?";
    }

    [[noreturn]] void fail_at(uint32_t offset, const std::string& msg) const {
        const auto [line, col] = line_col(src_, offset);
        fail(name_, ":", line, ":", col, ": syntax error: ", msg);
    }
    [[noreturn]] void unexpected(const std::string& expected) const {
        fail_at(cur().offset, "expected " + expected + ", got " + describe(cur()));
    }
    void expect_op(std::string_view op) {
        if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
    }
    void expect_block_end() {
        if (cur().type != Tok::BlockEnd) unexpected("'%}'");
        advance();
    }
    std::string expect_name() {
        if (cur().type != Tok::Name) unexpected("a name");
        std::string n = cur().value;
        advance();
        return n;
    }

    struct DepthGuard {
        Parser& p;
        explicit DepthGuard(Parser& parser) : p(parser) {
            if (++p.depth_ > kMaxParseDepth) p.fail_at(p.cur().offset, "template nested too deeply");
        }
        ~DepthGuard() { --p.depth_; }
    };

    static ExprPtr make(Expr::Kind kind, uint32_t offset) {
        auto e = std::make_unique<Expr>();
        e->kind = kind;
        e->offset = offset;
        return e;
    }
    static NodePtr make_node(Node::Kind kind, uint32_t offset) {
        auto n = std::make_unique<Node>();
        n->kind = kind;
        n->offset = offset;
        return n;
    }

    // --- statements ---

    // Parses nodes until `{% <one of ends>`; consumes that tag's '{%' and name, stores the name in *which.
    Body parse_body(std::initializer_list<std::string_view> ends, std::string* which, uint32_t open_offset = 0,
                    std::string_view opener = {}) {
        DepthGuard guard(*this);
        Body body;
        while (true) {
            const Token& t = cur();
            switch (t.type) {
                case Tok::Eof:
                    if (ends.size() == 0) return body;
                    fail_at(open_offset, "'" + std::string(opener) + "' block is never closed (expected 'end" +
                                             std::string(opener) + "')");
                case Tok::Text: {
                    auto n = make_node(Node::Kind::Text, t.offset);
                    n->text = t.value;
                    body.push_back(std::move(n));
                    advance();
                    break;
                }
                case Tok::VarBegin: {
                    auto n = make_node(Node::Kind::Output, t.offset);
                    advance();
                    n->expr = parse_tuple_expr();
                    if (cur().type != Tok::VarEnd) unexpected("'}}'");
                    advance();
                    body.push_back(std::move(n));
                    break;
                }
                case Tok::BlockBegin: {
                    const Token& kw = peek();
                    if (kw.type == Tok::Name) {
                        for (std::string_view e : ends) {
                            if (kw.value == e) {
                                advance();
                                advance();
                                *which = kw.value;
                                return body;
                            }
                        }
                    }
                    body.push_back(parse_statement());
                    break;
                }
                default:
                    unexpected("text or a tag");
            }
        }
    }

    NodePtr parse_statement() {
        const uint32_t offset = cur().offset;
        advance();  // '{%'
        if (cur().type != Tok::Name) unexpected("a statement name");
        const std::string kw = cur().value;
        const uint32_t kw_offset = cur().offset;
        advance();
        if (kw == "if") return parse_if(offset);
        if (kw == "for") return parse_for(offset);
        if (kw == "set") return parse_set(offset);
        if (kw == "macro") return parse_macro(offset);
        if (kw == "call") return parse_call_block(offset);
        if (kw == "filter") return parse_filter_block(offset);
        if (kw == "break" || kw == "continue") {
            auto n = make_node(kw == "break" ? Node::Kind::Break : Node::Kind::Continue, offset);
            expect_block_end();
            return n;
        }
        if (kw == "do") {
            auto n = make_node(Node::Kind::Do, offset);
            n->expr = parse_tuple_expr();
            expect_block_end();
            return n;
        }
        if (kw == "with") return parse_with(offset);
        if (kw == "generation") {
            auto n = make_node(Node::Kind::Scope, offset);
            expect_block_end();
            std::string which;
            n->body = parse_body({"endgeneration"}, &which, offset, "generation");
            expect_block_end();
            return n;
        }
        if (kw.rfind("end", 0) == 0 || kw == "else" || kw == "elif")
            fail_at(kw_offset, "unexpected '" + kw + "' (no block open that it could close)");
        fail_at(kw_offset, "unknown tag '" + kw + "'");
    }

    NodePtr parse_if(uint32_t offset) {
        auto n = make_node(Node::Kind::If, offset);
        ExprPtr cond = parse_expr();
        expect_block_end();
        while (true) {
            std::string which;
            Body body = parse_body({"elif", "else", "endif"}, &which, offset, "if");
            n->branches.emplace_back(std::move(cond), std::move(body));
            if (which == "elif") {
                cond = parse_expr();
                expect_block_end();
                continue;
            }
            if (which == "else") {
                expect_block_end();
                Body else_body = parse_body({"endif"}, &which, offset, "if");
                n->branches.emplace_back(nullptr, std::move(else_body));
            }
            expect_block_end();
            return n;
        }
    }

    void parse_targets(std::vector<std::string>& targets) {
        const bool paren = skip_op("(");
        targets.push_back(expect_name());
        while (skip_op(",")) {
            if (cur().type != Tok::Name) break;
            targets.push_back(expect_name());
        }
        if (paren) expect_op(")");
    }

    NodePtr parse_for(uint32_t offset) {
        auto n = make_node(Node::Kind::For, offset);
        parse_targets(n->targets);
        if (!skip_name("in")) unexpected("'in'");
        n->expr = parse_expr(false);
        if (is_op(",")) {  // `for x in a, b`
            auto t = make(Expr::Kind::Tuple, n->expr->offset);
            t->args.push_back(std::move(n->expr));
            while (skip_op(",")) t->args.push_back(parse_expr(false));
            n->expr = std::move(t);
        }
        if (skip_name("if")) n->cond = parse_expr();
        if (is_name("recursive")) fail_at(cur().offset, "recursive for loops are not supported");
        expect_block_end();
        std::string which;
        n->body = parse_body({"else", "endfor"}, &which, offset, "for");
        if (which == "else") {
            expect_block_end();
            n->else_body = parse_body({"endfor"}, &which, offset, "for");
        }
        expect_block_end();
        return n;
    }

    NodePtr parse_set(uint32_t offset) {
        std::vector<std::string> targets;
        std::string attr;
        targets.push_back(expect_name());
        if (skip_op(".")) {
            attr = expect_name();
        } else {
            while (skip_op(",")) targets.push_back(expect_name());
        }
        if (skip_op("=")) {
            auto n = make_node(Node::Kind::Set, offset);
            n->targets = std::move(targets);
            n->attr = std::move(attr);
            n->expr = parse_tuple_expr();
            expect_block_end();
            return n;
        }
        if (targets.size() != 1 || !attr.empty()) unexpected("'='");
        auto n = make_node(Node::Kind::SetBlock, offset);
        n->targets = std::move(targets);
        if (is_op("|")) n->expr = parse_filter_chain(nullptr);
        expect_block_end();
        std::string which;
        n->body = parse_body({"endset"}, &which, offset, "set");
        expect_block_end();
        return n;
    }

    void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
        expect_op("(");
        while (!is_op(")")) {
            std::string name = expect_name();
            ExprPtr dflt;
            if (skip_op("=")) dflt = parse_expr();
            params.emplace_back(std::move(name), std::move(dflt));
            if (!skip_op(",")) break;
        }
        expect_op(")");
    }

    NodePtr parse_macro(uint32_t offset) {
        auto n = make_node(Node::Kind::Macro, offset);
        n->text = expect_name();
        parse_params(n->params);
        expect_block_end();
        std::string which;
        n->body = parse_body({"endmacro"}, &which, offset, "macro");
        if (cur().type == Tok::Name) advance();  // {% endmacro name %}
        expect_block_end();
        return n;
    }

    NodePtr parse_call_block(uint32_t offset) {
        auto n = make_node(Node::Kind::CallBlock, offset);
        if (is_op("(")) parse_params(n->params);
        n->expr = parse_expr();
        if (n->expr->kind != Expr::Kind::Call) fail_at(n->expr->offset, "expected a call after 'call'");
        expect_block_end();
        std::string which;
        n->body = parse_body({"endcall"}, &which, offset, "call");
        expect_block_end();
        return n;
    }

    NodePtr parse_filter_block(uint32_t offset) {
        auto n = make_node(Node::Kind::FilterBlock, offset);
        n->expr = parse_filter_chain(nullptr, /*leading_pipe=*/false);
        expect_block_end();
        std::string which;
        n->body = parse_body({"endfilter"}, &which, offset, "filter");
        expect_block_end();
        return n;
    }

    NodePtr parse_with(uint32_t offset) {
        auto n = make_node(Node::Kind::With, offset);
        while (cur().type == Tok::Name) {
            std::string name = expect_name();
            expect_op("=");
            n->params.emplace_back(std::move(name), parse_expr());
            if (!skip_op(",")) break;
        }
        expect_block_end();
        std::string which;
        n->body = parse_body({"endwith"}, &which, offset, "with");
        expect_block_end();
        return n;
    }

    // --- expressions ---

    // An expression, or a tuple of them without parentheses (`{{ a, b }}`, `set x = 1, 2`).
    ExprPtr parse_tuple_expr() {
        ExprPtr e = parse_expr();
        if (!is_op(",")) return e;
        auto t = make(Expr::Kind::Tuple, e->offset);
        t->args.push_back(std::move(e));
        while (skip_op(",")) {
            if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd) break;
            t->args.push_back(parse_expr());
        }
        return t;
    }

    ExprPtr parse_expr(bool with_cond = true) {
        DepthGuard guard(*this);
        ExprPtr e = parse_or();
        if (!with_cond) return e;
        while (is_name("if")) {
            const uint32_t off = cur().offset;
            advance();
            auto c = make(Expr::Kind::Cond, off);
            c->args.push_back(parse_or());
            c->args.push_back(std::move(e));
            c->args.push_back(skip_name("else") ? parse_expr() : nullptr);
            e = std::move(c);
        }
        return e;
    }

    ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, uint32_t offset) {
        auto b = make(Expr::Kind::Binary, offset);
        b->name = std::move(op);
        b->args.push_back(std::move(l));
        b->args.push_back(std::move(r));
        return b;
    }

    ExprPtr parse_or() {
        ExprPtr e = parse_and();
        while (is_name("or")) {
            const uint32_t off = cur().offset;
            advance();
            e = binary("or", std::move(e), parse_and(), off);
        }
        return e;
    }

    ExprPtr parse_and() {
        ExprPtr e = parse_not();
        while (is_name("and")) {
            const uint32_t off = cur().offset;
            advance();
            e = binary("and", std::move(e), parse_not(), off);
        }
        return e;
    }

    ExprPtr parse_not() {
        if (is_name("not")) {
            DepthGuard guard(*this);
            auto u = make(Expr::Kind::Unary, cur().offset);
            advance();
            u->name = "not";
            u->args.push_back(parse_not());
            return u;
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        ExprPtr first = parse_math1();
        ExprPtr cmp;
        while (true) {
            std::string op;
            const uint32_t off = cur().offset;
            if (cur().type == Tok::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                          cur().value == ">" || cur().value == "<=" || cur().value == ">=")) {
                op = cur().value;
                advance();
            } else if (is_name("in")) {
                op = "in";
                advance();
            } else if (is_name("not") && peek().type == Tok::Name && peek().value == "in") {
                op = "not in";
                advance();
                advance();
            } else {
                break;
            }
            if (!cmp) {
                cmp = make(Expr::Kind::Compare, off);
                cmp->args.push_back(std::move(first));
            }
            cmp->ops.push_back(std::move(op));
            cmp->args.push_back(parse_math1());
        }
        return cmp ? std::move(cmp) : std::move(first);
    }

    ExprPtr parse_math1() {
        ExprPtr e = parse_concat();
        while (is_op("+") || is_op("-")) {
            const std::string op = cur().value;
            const uint32_t off = cur().offset;
            advance();
            e = binary(op, std::move(e), parse_concat(), off);
        }
        return e;
    }

    ExprPtr parse_concat() {
        ExprPtr e = parse_math2();
        while (is_op("~")) {
            const uint32_t off = cur().offset;
            advance();
            e = binary("~", std::move(e), parse_math2(), off);
        }
        return e;
    }

    ExprPtr parse_math2() {
        ExprPtr e = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const std::string op = cur().value;
            const uint32_t off = cur().offset;
            advance();
            e = binary(op, std::move(e), parse_pow(), off);
        }
        return e;
    }

    ExprPtr parse_pow() {
        ExprPtr e = parse_unary();
        while (is_op("**")) {
            const uint32_t off = cur().offset;
            advance();
            e = binary("**", std::move(e), parse_unary(), off);
        }
        return e;
    }

    ExprPtr parse_unary(bool with_filter = true) {
        DepthGuard guard(*this);
        ExprPtr e;
        if (is_op("-") || is_op("+")) {
            auto u = make(Expr::Kind::Unary, cur().offset);
            u->name = cur().value;
            advance();
            u->args.push_back(parse_unary(false));
            e = std::move(u);
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }

    ExprPtr parse_primary() {
        const Token& t = cur();
        const uint32_t off = t.offset;
        switch (t.type) {
            case Tok::Name: {
                auto e = make(Expr::Kind::Literal, off);
                if (t.value == "true" || t.value == "True") {
                    e->value = Value(true);
                } else if (t.value == "false" || t.value == "False") {
                    e->value = Value(false);
                } else if (t.value == "none" || t.value == "None") {
                    e->value = Value::none();
                } else {
                    e->kind = Expr::Kind::Name;
                    e->name = t.value;
                }
                advance();
                return e;
            }
            case Tok::String: {
                auto e = make(Expr::Kind::Literal, off);
                std::string s;
                while (cur().type == Tok::String) {  // adjacent literals concatenate
                    s += cur().value;
                    advance();
                }
                e->value = Value(std::move(s));
                return e;
            }
            case Tok::Int: {
                auto e = make(Expr::Kind::Literal, off);
                int64_t v = 0;
                if (parse_int(t.value, v))
                    e->value = Value(v);
                else  // beyond int64: a float (inf past its range), not an error
                    e->value = Value(std::strtod(t.value.c_str(), nullptr));
                advance();
                return e;
            }
            case Tok::Float: {
                auto e = make(Expr::Kind::Literal, off);
                e->value = Value(std::strtod(t.value.c_str(), nullptr));
                advance();
                return e;
            }
            case Tok::Op:
                if (t.value == "(") {
                    advance();
                    if (skip_op(")")) return make(Expr::Kind::Tuple, off);
                    ExprPtr e = parse_expr();
                    if (is_op(",")) {
                        auto tup = make(Expr::Kind::Tuple, off);
                        tup->args.push_back(std::move(e));
                        while (skip_op(",")) {
                            if (is_op(")")) break;
                            tup->args.push_back(parse_expr());
                        }
                        e = std::move(tup);
                    }
                    expect_op(")");
                    return e;
                }
                if (t.value == "[") {
                    advance();
                    auto e = make(Expr::Kind::List, off);
                    while (!is_op("]")) {
                        e->args.push_back(parse_expr());
                        if (!skip_op(",")) break;
                    }
                    expect_op("]");
                    return e;
                }
                if (t.value == "{") {
                    advance();
                    auto e = make(Expr::Kind::Dict, off);
                    while (!is_op("}")) {
                        e->args.push_back(parse_expr());
                        expect_op(":");
                        e->args.push_back(parse_expr());
                        if (!skip_op(",")) break;
                    }
                    expect_op("}");
                    return e;
                }
                break;
            default:
                break;
        }
        unexpected("an expression");
    }

    void parse_call_args(Expr& call) {
        expect_op("(");
        while (!is_op(")")) {
            if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "=") {
                std::string key = cur().value;
                advance();
                advance();
                call.kwargs.emplace_back(std::move(key), parse_expr());
            } else {
                if (!call.kwargs.empty()) fail_at(cur().offset, "positional argument after keyword argument");
                call.args.push_back(parse_expr());
            }
            if (!skip_op(",")) break;
        }
        expect_op(")");
    }

    ExprPtr parse_postfix(ExprPtr e) {
        while (true) {
            const uint32_t off = cur().offset;
            if (is_op(".")) {
                advance();
                if (cur().type == Tok::Int) {  // x.0
                    auto g = make(Expr::Kind::GetItem, off);
                    g->args.push_back(std::move(e));
                    auto idx = make(Expr::Kind::Literal, cur().offset);
                    int64_t v = 0;
                    if (!parse_int(cur().value, v))
                        fail_at(cur().offset, "index '" + cur().value + "' is out of range");
                    idx->value = Value(v);
                    g->args.push_back(std::move(idx));
                    advance();
                    e = std::move(g);
                    continue;
                }
                auto g = make(Expr::Kind::GetAttr, off);
                g->name = expect_name();
                g->args.push_back(std::move(e));
                e = std::move(g);
            } else if (is_op("[")) {
                advance();
                e = parse_subscript(std::move(e), off);
            } else if (is_op("(")) {
                auto c = make(Expr::Kind::Call, e->offset);  // errors point at the callee
                c->args.push_back(std::move(e));
                parse_call_args(*c);
                e = std::move(c);
            } else {
                return e;
            }
        }
    }

    ExprPtr parse_subscript(ExprPtr obj, uint32_t off) {
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
            if (!is_op(":") && !is_op("]")) parts[n] = parse_expr();
            if (skip_op(":")) {
                slice = true;
                if (++n > 2) unexpected("']'");
                continue;
            }
            break;
        }
        expect_op("]");
        if (!slice) {
            if (!parts[0]) fail_at(off, "empty subscript");
            auto g = make(Expr::Kind::GetItem, off);
            g->args.push_back(std::move(obj));
            g->args.push_back(std::move(parts[0]));
            return g;
        }
        auto s = make(Expr::Kind::Slice, off);
        s->args.push_back(std::move(obj));
        for (auto& p : parts) s->args.push_back(std::move(p));
        return s;
    }

    // `| name(args) | name2 ...` applied to `operand` (null for filter blocks and block sets).
    ExprPtr parse_filter_chain(ExprPtr operand, bool leading_pipe = true) {
        bool first = true;
        while ((first && !leading_pipe) || is_op("|")) {
            if (!(first && !leading_pipe)) advance();
            first = false;
            auto f = make(Expr::Kind::Filter, cur().offset);
            f->name = expect_name();
            while (is_op(".") && peek().type == Tok::Name) {  // dotted filter names
                advance();
                f->name += "." + cur().value;
                advance();
            }
            f->args.push_back(std::move(operand));
            if (is_op("(")) parse_call_args(*f);
            operand = std::move(f);
        }
        return operand;
    }

    ExprPtr parse_filter_expr(ExprPtr e) {
        while (true) {
            if (is_op("|")) {
                e = parse_filter_chain(std::move(e));
            } else if (is_name("is")) {
                const uint32_t off = cur().offset;
                advance();
                auto t = make(Expr::Kind::Test, off);
                t->negated = skip_name("not");
                t->name = expect_name();
                t->args.push_back(std::move(e));
                if (is_op("(")) {
                    parse_call_args(*t);
                } else if ((cur().type == Tok::Name && !is_keyword(cur().value)) || cur().type == Tok::String ||
                           cur().type == Tok::Int || cur().type == Tok::Float || is_op("[") || is_op("{")) {
                    t->args.push_back(parse_postfix(parse_primary()));
                }
                e = std::move(t);
            } else if (is_op("(")) {
                auto c = make(Expr::Kind::Call, cur().offset);
                c->args.push_back(std::move(e));
                parse_call_args(*c);
                e = std::move(c);
            } else {
                return e;
            }
        }
    }

    std::string_view src_;
    std::string_view name_;
    std::vector<Token> toks_;
    size_t pos_ = 0;
    int depth_ = 0;
};

}  // namespace

Program parse(std::string_view source, std::string_view name, const LexOptions& opt) {
    std::vector<Token> tokens;
    try {
        tokens = tokenize(source, opt);
    } catch (const LexError& e) {
        const auto [line, col] = line_col(source, e.offset);
        fail(name, ":", line, ":", col, ": syntax error: ", e.message);
    }
    return Parser(source, name, std::move(tokens)).run();
}

}  // namespace peregrine::jinja
