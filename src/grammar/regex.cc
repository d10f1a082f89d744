#include "grammar/regex.h"

#include <cctype>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "grammar/utf8.h"

namespace peregrine::grammar {

namespace {

CodePointRanges digit_class() {
    return {{'0', '9'}};
}
CodePointRanges word_class() {
    return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
}
CodePointRanges space_class() {
    return {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
            {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}

class RegexParser {
  public:
    RegexParser(Grammar& g, std::string_view p, const RegexOptions& o) : g_(g), p_(p), s_(p), o_(o) {}

    int parse() {
        if (!p_.empty() && p_[0] == '^') pos_ = 1;
        int e = alternation();
        if (pos_ < p_.size()) error("unbalanced ')'");
        return e;
    }

  private:
    [[noreturn]] void error(const std::string& what) const {
        fail("regex: ", what, " at offset ", pos_, " in /", std::string(p_), "/");
    }
    bool at(char c) const { return pos_ < p_.size() && p_[pos_] == c; }

    int alternation() {
        std::vector<int> alts{sequence()};
        while (at('|')) {
            ++pos_;
            alts.push_back(sequence());
        }
        return g_.alt(std::move(alts));
    }

    int sequence() {
        std::vector<int> items;
        while (pos_ < p_.size() && !at('|') && !at(')')) {
            if (at('$')) {
                if (pos_ + 1 == p_.size()) {
                    ++pos_;
                    break;
                }
                error("'$' anchor before the end (only whole-text matches are supported)");
            }
            if (at('^')) error("'^' anchor after the start (only whole-text matches are supported)");
            int atom_expr = atom();
            items.push_back(quantified(atom_expr));
        }
        return g_.seq(std::move(items));
    }

    int read_int() {
        size_t start = pos_;
        long v = 0;
        while (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') {
            v = v * 10 + (p_[pos_++] - '0');
            if (v > 100000) error("repetition count too large");
        }
        return pos_ == start ? -1 : int(v);
    }

    int quantified(int e) {
        for (;;) {
            int min, max;
            if (at('*')) {
                min = 0, max = kUnbounded, ++pos_;
            } else if (at('+')) {
                min = 1, max = kUnbounded, ++pos_;
            } else if (at('?')) {
                min = 0, max = 1, ++pos_;
            } else if (at('{')) {
                size_t save = pos_++;
                min = read_int();
                max = min;
                if (min >= 0 && at(',')) {
                    ++pos_;
                    max = read_int();
                    if (max < 0) max = kUnbounded;
                }
                if (min < 0 || !at('}')) {  // not a quantifier: a literal '{'
                    pos_ = save;
                    return e;
                }
                ++pos_;
                if (max != kUnbounded && max < min) error("repetition {m,n} with n < m");
            } else {
                return e;
            }
            if (at('?')) ++pos_;  // lazy: same language
            if (at('+')) error("possessive quantifiers are not supported");
            e = g_.repeat(e, min, max);
        }
    }

    uint32_t hex(size_t digits) {
        uint32_t v = 0;
        for (size_t i = 0; i < digits; ++i) {
            if (pos_ >= p_.size() || !isxdigit(static_cast<unsigned char>(p_[pos_]))) error("bad hex escape");
            char c = p_[pos_++];
            v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        }
        return v;
    }

    // After a backslash: a class escape (\d...) into `cls` returning true, or one code point.
    bool escape(CodePointRanges& cls, uint32_t& cp) {
        if (pos_ >= p_.size()) error("trailing backslash");
        char c = p_[pos_++];
        switch (c) {
            case 'd':
                cls = digit_class();
                return true;
            case 'D':
                cls = complement(digit_class());
                return true;
            case 'w':
                cls = word_class();
                return true;
            case 'W':
                cls = complement(word_class());
                return true;
            case 's':
                cls = space_class();
                return true;
            case 'S':
                cls = complement(space_class());
                return true;
            case 'n':
                cp = '\n';
                return false;
            case 't':
                cp = '\t';
                return false;
            case 'r':
                cp = '\r';
                return false;
            case 'f':
                cp = '\f';
                return false;
            case 'v':
                cp = '\v';
                return false;
            case '0':
                cp = 0;
                return false;
            case 'x':
                cp = hex(2);
                return false;
            case 'u':
                if (at('{')) {
                    ++pos_;
                    cp = 0;
                    size_t n = 0;
                    while (!at('}')) {
                        cp = cp * 16 + hex(1);
                        if (++n > 6) error("bad \\u{...} escape");
                    }
                    ++pos_;
                    if (cp > kMaxCodePoint) error("code point out of range");
                } else {
                    cp = hex(4);
                }
                return false;
            case 'b':
            case 'B':
                --pos_, error("word boundary assertions (\\b, \\B) are not supported");
            case 'p':
            case 'P':
                --pos_, error("unicode property escapes (\\p{...}) are not supported");
            case 'c':
                --pos_, error("control escapes (\\cX) are not supported");
            case 'k':
                --pos_, error("named backreferences are not supported");
            default:
                if (c >= '1' && c <= '9') --pos_, error("backreferences are not supported");
                if (std::isalnum(static_cast<unsigned char>(c))) --pos_, error(std::string("unknown escape \\") + c);
                pos_--;
                cp = decode_utf8(s_, pos_);
                return false;
        }
    }

    int atom() {
        char c = p_[pos_];
        if (c == '(') {
            ++pos_;
            if (at('?')) {
                ++pos_;
                if (at(':')) {
                    ++pos_;
                } else if (at('<') && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
                    while (pos_ < p_.size() && p_[pos_] != '>') ++pos_;
                    ++pos_;
                } else if (at('P') && pos_ + 1 < p_.size() && p_[pos_ + 1] == '<') {
                    while (pos_ < p_.size() && p_[pos_] != '>') ++pos_;
                    ++pos_;
                } else {
                    error("lookaround and inline flags ((?=, (?!, (?<=, (?<!, (?i) are not supported");
                }
            }
            int e = alternation();
            if (!at(')')) error("missing ')'");
            ++pos_;
            return e;
        }
        if (c == '[') return char_set(bracket());
        if (c == '.') {
            ++pos_;
            return char_set(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
        }
        if (c == '*' || c == '+' || c == '?') error("nothing to repeat");
        if (c == '{' && pos_ + 1 < p_.size() && std::isdigit(static_cast<unsigned char>(p_[pos_ + 1]))) {
            size_t save = pos_;
            ++pos_;
            if (read_int() >= 0 && (at('}') || at(','))) {
                pos_ = save;
                error("nothing to repeat");
            }
            pos_ = save;
        }
        uint32_t cp;
        if (c == '\\') {
            ++pos_;
            CodePointRanges cls;
            if (escape(cls, cp)) return char_set(cls);
        } else {
            cp = decode_utf8(s_, pos_);
        }
        return char_set({{cp, cp}});
    }

    CodePointRanges bracket() {
        ++pos_;  // '['
        bool negate = at('^');
        if (negate) ++pos_;
        CodePointRanges r;
        while (pos_ < p_.size() && !at(']')) {
            uint32_t lo;
            CodePointRanges cls;
            if (at('\\')) {
                ++pos_;
                if (escape(cls, lo)) {
                    r.insert(r.end(), cls.begin(), cls.end());
                    continue;
                }
            } else {
                lo = decode_utf8(s_, pos_);
            }
            uint32_t hi = lo;
            if (at('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
                ++pos_;
                if (at('\\')) {
                    ++pos_;
                    if (escape(cls, hi)) error("a class escape cannot end a range");
                } else {
                    hi = decode_utf8(s_, pos_);
                }
                if (hi < lo) error("range out of order in character class");
            }
            r.emplace_back(lo, hi);
        }
        if (!at(']')) error("missing ']'");
        ++pos_;
        normalize(r);
        if (negate) r = complement(r);
        if (r.empty()) error("a character class that matches nothing");
        return r;
    }

    // One character of `r`; in JSON-string mode, '"', '\' and control characters escaped.
    int char_set(CodePointRanges r) {
        if (!o_.json_string) return utf8_class(g_, std::move(r));
        normalize(r);
        CodePointRanges plain;
        std::vector<int> alts;
        for (auto [lo, hi] : r) {
            for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
                if (cp >= 0x20 && cp != '"' && cp != '\\') continue;
                static const char* kShort[] = {"\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004",
                                               "\\u0005", "\\u0006", "\\u0007", "\\b",     "\\t",
                                               "\\n",     "\\u000b", "\\f",     "\\r"};
                std::string esc;
                if (cp == '"') {
                    esc = "\\\"";
                } else if (cp == '\\') {
                    esc = "\\\\";
                } else if (cp < 14) {
                    esc = kShort[cp];
                } else {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", cp);
                    esc = buf;
                }
                alts.push_back(g_.literal(esc));
            }
            // The plain part: r minus control characters, '"' and '\'.
            CodePointRanges cut = {{lo, hi}};
            for (auto [xlo, xhi] : CodePointRanges{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}) {
                CodePointRanges next;
                for (auto [a, b] : cut) {
                    if (b < xlo || a > xhi) {
                        next.emplace_back(a, b);
                        continue;
                    }
                    if (a < xlo) next.emplace_back(a, xlo - 1);
                    if (b > xhi) next.emplace_back(xhi + 1, b);
                }
                cut = std::move(next);
            }
            plain.insert(plain.end(), cut.begin(), cut.end());
        }
        if (!plain.empty()) alts.insert(alts.begin(), utf8_class(g_, plain));
        return g_.alt(std::move(alts));
    }

    Grammar& g_;
    std::string_view p_;
    std::string s_;  // p_ as a string, for decode_utf8
    RegexOptions o_;
    size_t pos_ = 0;
};

}  // namespace

int regex_expr(Grammar& g, std::string_view pattern, const RegexOptions& options) {
    return RegexParser(g, pattern, options).parse();
}

Grammar compile_regex(std::string_view pattern) {
    Grammar g;
    int e = regex_expr(g, pattern);
    g.root = g.add_rule("root", e);
    return g;
}

Grammar compile_choice(const std::vector<std::string>& choices) {
    if (choices.empty()) fail("guided_choice needs at least one choice");
    Grammar g;
    std::vector<int> alts;
    for (const std::string& c : choices) alts.push_back(g.literal(c));
    g.root = g.add_rule("root", g.alt(std::move(alts)));
    return g;
}

}  // namespace peregrine::grammar
