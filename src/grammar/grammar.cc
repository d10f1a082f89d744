#include "grammar/grammar.h"

#include <cstdio>

#include "core/error.h"

namespace peregrine::grammar {

int Grammar::empty() {
    exprs.push_back(Expr{});
    return static_cast<int>(exprs.size()) - 1;
}

int Grammar::bytes(const ByteSet& set) {
    Expr e;
    e.kind = Expr::Kind::Bytes;
    e.bytes = set;
    exprs.push_back(std::move(e));
    return static_cast<int>(exprs.size()) - 1;
}

int Grammar::byte_range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.set_range(lo, hi);
    return bytes(s);
}

int Grammar::literal(std::string_view text) {
    if (text.size() == 1) return byte_range(static_cast<uint8_t>(text[0]), static_cast<uint8_t>(text[0]));
    std::vector<int> items;
    items.reserve(text.size());
    for (char c : text) items.push_back(byte_range(static_cast<uint8_t>(c), static_cast<uint8_t>(c)));
    return seq(std::move(items));
}

int Grammar::seq(std::vector<int> items) {
    if (items.empty()) return empty();
    if (items.size() == 1) return items[0];
    Expr e;
    e.kind = Expr::Kind::Seq;
    e.children = std::move(items);
    exprs.push_back(std::move(e));
    return static_cast<int>(exprs.size()) - 1;
}

int Grammar::alt(std::vector<int> items) {
    PG_CHECK(!items.empty(), "an alternation needs at least one branch");
    if (items.size() == 1) return items[0];
    Expr e;
    e.kind = Expr::Kind::Alt;
    e.children = std::move(items);
    exprs.push_back(std::move(e));
    return static_cast<int>(exprs.size()) - 1;
}

int Grammar::ref(int rule) {
    Expr e;
    e.kind = Expr::Kind::Ref;
    e.rule = rule;
    exprs.push_back(std::move(e));
    return static_cast<int>(exprs.size()) - 1;
}

int Grammar::repeat(int item, int min, int max) {
    PG_CHECK(min >= 0 && (max == kUnbounded || max >= min), "bad repetition bounds ", min, "..", max);
    if (min == 1 && max == 1) return item;
    if (max == 0) return empty();
    Expr e;
    e.kind = Expr::Kind::Repeat;
    e.children = {item};
    e.min = min;
    e.max = max;
    exprs.push_back(std::move(e));
    return static_cast<int>(exprs.size()) - 1;
}

int Grammar::subset(std::vector<int> items, std::vector<bool> required, int sep, int tail) {
    PG_CHECK(items.size() == required.size() && sep >= 0);
    Expr e;
    e.kind = Expr::Kind::Subset;
    e.children = std::move(items);
    e.required = std::move(required);
    e.sep = sep;
    e.tail = tail;
    exprs.push_back(std::move(e));
    return static_cast<int>(exprs.size()) - 1;
}

int Grammar::add_rule(std::string name, int body) {
    rules.push_back(Rule{std::move(name), body});
    return static_cast<int>(rules.size()) - 1;
}

int Grammar::find_rule(std::string_view name) const {
    for (size_t i = 0; i < rules.size(); ++i)
        if (rules[i].name == name) return static_cast<int>(i);
    return -1;
}

namespace {

std::string byte_text(int b) {
    if (b >= 0x21 && b < 0x7f && b != '\\' && b != ']' && b != '-' && b != '^') return std::string(1, char(b));
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", b);
    return buf;
}

std::string set_text(const ByteSet& s) {
    std::string out = "[";
    for (int b = 0; b < 256;) {
        if (!s.has(static_cast<uint8_t>(b))) {
            ++b;
            continue;
        }
        int e = b;
        while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
        out += byte_text(b);
        if (e > b) out += "-" + byte_text(e);
        b = e + 1;
    }
    return out + "]";
}

}  // namespace

std::string Grammar::expr_to_string(int i) const {
    const Expr& e = exprs[static_cast<size_t>(i)];
    std::string out;
    switch (e.kind) {
        case Expr::Kind::Empty:
            return "\"\"";
        case Expr::Kind::Bytes:
            return set_text(e.bytes);
        case Expr::Kind::Ref:
            return rules[static_cast<size_t>(e.rule)].name;
        case Expr::Kind::Seq:
        case Expr::Kind::Alt:
            out = "(";
            for (size_t k = 0; k < e.children.size(); ++k) {
                if (k) out += e.kind == Expr::Kind::Seq ? " " : " | ";
                out += expr_to_string(e.children[k]);
            }
            return out + ")";
        case Expr::Kind::Repeat:
            return expr_to_string(e.children[0]) + "{" + std::to_string(e.min) + "," +
                   (e.max == kUnbounded ? std::string() : std::to_string(e.max)) + "}";
        case Expr::Kind::Subset:
            out = "subset<sep=" + expr_to_string(e.sep) + ">(";
            for (size_t k = 0; k < e.children.size(); ++k)
                out += (k ? ", " : "") + expr_to_string(e.children[k]) + (e.required[k] ? "" : "?");
            if (e.tail >= 0) out += ", " + expr_to_string(e.tail) + "*";
            return out + ")";
    }
    return out;
}

std::string Grammar::to_string() const {
    std::string out;
    for (const Rule& r : rules)
        out += r.name + " ::= " + (r.body >= 0 ? expr_to_string(r.body) : std::string("<undefined>")) + "\n";
    return out;
}

}  // namespace peregrine::grammar
