#include "grammar/gbnf.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/error.h"
#include "grammar/utf8.h"

namespace peregrine::grammar {

namespace {

bool name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

class GbnfParser {
  public:
    explicit GbnfParser(std::string_view t) : s_(t) {}

    Grammar parse() {
        skip();
        while (pos_ < s_.size()) {
            std::string name = read_name();
            skip();
            if (s_.compare(pos_, 3, "::=") != 0) error("expected '::=' after rule name '" + name + "'");
            pos_ += 3;
            int rule = rule_id(name);
            if (g_.rules[size_t(rule)].body >= 0) error("rule '" + name + "' defined twice");
            defined_.push_back(rule);
            g_.rules[size_t(rule)].body = alternatives();
            skip();
        }
        for (size_t r = 0; r < g_.rules.size(); ++r)
            if (g_.rules[r].body < 0) fail("gbnf: rule '", g_.rules[r].name, "' is used but not defined");
        g_.root = g_.find_rule("root");
        if (g_.root < 0 || g_.rules[size_t(g_.root)].body < 0) fail("gbnf: the grammar has no 'root' rule");
        return std::move(g_);
    }

  private:
    [[noreturn]] void error(const std::string& what) const {
        size_t line = 1 + size_t(std::count(s_.begin(), s_.begin() + long(std::min(pos_, s_.size())), '\n'));
        fail("gbnf: ", what, " (line ", line, ")");
    }

    void skip() {
        while (pos_ < s_.size()) {
            if (std::isspace(static_cast<unsigned char>(s_[pos_]))) {
                ++pos_;
            } else if (s_[pos_] == '#') {
                while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
            } else {
                break;
            }
        }
    }
    bool at(char c) {
        skip();
        return pos_ < s_.size() && s_[pos_] == c;
    }

    std::string read_name() {
        size_t start = pos_;
        while (pos_ < s_.size() && name_char(s_[pos_])) ++pos_;
        if (pos_ == start) error(std::string("unexpected character '") + s_[pos_] + "'");
        return s_.substr(start, pos_ - start);
    }

    int rule_id(const std::string& name) {
        int r = g_.find_rule(name);
        return r >= 0 ? r : g_.add_rule(name);
    }

    // Is the text at pos_ the start of the next rule ("name ::=")?
    bool at_rule_start() {
        skip();
        size_t p = pos_;
        while (p < s_.size() && name_char(s_[p])) ++p;
        if (p == pos_) return false;
        while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
        return s_.compare(p, 3, "::=") == 0;
    }

    int alternatives() {
        std::vector<int> alts{sequence()};
        while (at('|')) {
            ++pos_;
            alts.push_back(sequence());
        }
        return g_.alt(std::move(alts));
    }

    int sequence() {
        std::vector<int> items;
        for (;;) {
            skip();
            if (pos_ >= s_.size() || at('|') || at(')') || at_rule_start()) break;
            items.push_back(quantified(primary()));
        }
        return g_.seq(std::move(items));
    }

    int read_int() {
        skip();
        size_t start = pos_;
        long v = 0;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
            v = v * 10 + (s_[pos_++] - '0');
            if (v > 100000) error("repetition count too large");
        }
        return pos_ == start ? -1 : int(v);
    }

    int quantified(int e) {
        for (;;) {
            if (pos_ >= s_.size()) return e;
            char c = s_[pos_];  // no whitespace between an item and its quantifier
            if (c == '*') {
                ++pos_, e = g_.star(e);
            } else if (c == '+') {
                ++pos_, e = g_.plus(e);
            } else if (c == '?') {
                ++pos_, e = g_.opt(e);
            } else if (c == '{') {
                ++pos_;
                int min = read_int(), max = min;
                if (min < 0) error("expected a number after '{'");
                if (at(',')) {
                    ++pos_;
                    max = read_int();
                    if (max < 0) max = kUnbounded;
                }
                if (!at('}')) error("expected '}'");
                ++pos_;
                if (max != kUnbounded && max < min) error("repetition {m,n} with n < m");
                e = g_.repeat(e, min, max);
            } else {
                return e;
            }
        }
    }

    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
            if (pos_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) error("bad hex escape");
            char c = s_[pos_++];
            v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        }
        return v;
    }

    // One character of a literal or class, escapes decoded.
    uint32_t character() {
        if (pos_ >= s_.size()) error("unterminated literal or class");
        if (s_[pos_] != '\\') return decode_utf8(s_, pos_);
        ++pos_;
        if (pos_ >= s_.size()) error("trailing backslash");
        char c = s_[pos_++];
        switch (c) {
            case 'n':
                return '\n';
            case 'r':
                return '\r';
            case 't':
                return '\t';
            case '0':
                return 0;
            case 'x':
                return hex(2);
            case 'u':
                return hex(4);
            case 'U':
                return hex(8);
            case '\\':
            case '"':
            case '[':
            case ']':
            case '-':
            case '^':
            case '\'':
            case '/':
                return uint8_t(c);
            default:
                --pos_, error(std::string("unknown escape \\") + c);
        }
    }

    int primary() {
        skip();
        char c = s_[pos_];
        if (c == '"') {
            ++pos_;
            std::string lit;
            while (pos_ < s_.size() && s_[pos_] != '"') append_utf8(lit, character());
            if (pos_ >= s_.size()) error("unterminated string literal");
            ++pos_;
            return lit.empty() ? g_.empty() : g_.literal(lit);
        }
        if (c == '[') {
            ++pos_;
            bool negate = pos_ < s_.size() && s_[pos_] == '^';
            if (negate) ++pos_;
            CodePointRanges r;
            while (pos_ < s_.size() && s_[pos_] != ']') {
                uint32_t lo = character(), hi = lo;
                if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
                    ++pos_;
                    hi = character();
                    if (hi < lo) error("range out of order in character class");
                }
                r.emplace_back(lo, hi);
            }
            if (pos_ >= s_.size()) error("unterminated character class");
            ++pos_;
            normalize(r);
            if (negate) r = complement(r);
            if (r.empty()) error("a character class that matches nothing");
            return utf8_class(g_, std::move(r));
        }
        if (c == '(') {
            ++pos_;
            int e = alternatives();
            if (!at(')')) error("missing ')'");
            ++pos_;
            return e;
        }
        if (c == '.') {
            ++pos_;
            return utf8_class(g_, {{0, kMaxCodePoint}});
        }
        return g_.ref(rule_id(read_name()));
    }

    Grammar g_;
    std::string s_;
    size_t pos_ = 0;
    std::vector<int> defined_;
};

}  // namespace

Grammar compile_gbnf(std::string_view text) {
    return GbnfParser(text).parse();
}

}  // namespace peregrine::grammar
