#include "template/lexer.h"
#include "tokenizer/unicode.h"

#include <cstring>

namespace peregrine::jinja {

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
    return is_name_start(c) || is_digit(c);
}

class Lexer {
  public:
    Lexer(std::string_view src, const LexOptions& opt) : src_(src), opt_(opt) {}

    std::vector<Token> run() {
        size_t pos = 0;
        while (pos < src_.size()) {
            const size_t tag = find_tag(pos);
            std::string text(src_.substr(pos, tag - pos));
            if (tag == src_.size()) {
                push_text(std::move(text), pos);
                break;
            }
            const char kind = src_[tag + 1];  // '{', '%' or '#'
            const char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
            if (mod == '-') {
                rstrip_all(text);
            } else if (opt_.lstrip_blocks && kind != '{' && mod != '+') {
                lstrip_line(text, tag);
            }
            push_text(std::move(text), pos);
            size_t p = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
            if (kind == '#') {
                pos = lex_comment(tag, p);
            } else if (kind == '%') {
                pos = lex_block(tag, p);
            } else {
                pos = lex_var(tag, p);
            }
        }
        tokens_.push_back({Tok::Eof, "", static_cast<uint32_t>(src_.size())});
        return std::move(tokens_);
    }

  private:
    [[noreturn]] void fail(const std::string& msg, size_t offset) {
        throw LexError{msg, static_cast<uint32_t>(offset)};
    }

    size_t find_tag(size_t pos) const {
        while (true) {
            const size_t b = src_.find('{', pos);
            if (b == std::string_view::npos || b + 1 >= src_.size()) return src_.size();
            const char c = src_[b + 1];
            if (c == '{' || c == '%' || c == '#') return b;
            pos = b + 1;
        }
    }

    void push_text(std::string text, size_t offset) {
        if (text.empty()) return;
        if (!tokens_.empty() && tokens_.back().type == Tok::Text) {
            tokens_.back().value += text;
            return;
        }
        tokens_.push_back({Tok::Text, std::move(text), static_cast<uint32_t>(offset)});
    }

    static void rstrip_all(std::string& text) {
        size_t n = text.size();
        while (n > 0 && is_space(text[n - 1])) --n;
        text.resize(n);
    }

    // lstrip_blocks: remove the spaces and tabs before the tag when only they stand between it and the
    // start of its line. `text` is the source right before the tag, unmodified.
    void lstrip_line(std::string& text, size_t tag) {
        size_t n = text.size();
        while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\t')) --n;
        const size_t k = tag - (text.size() - n);
        if (k == 0 || src_[k - 1] == '\n') text.resize(n);
    }

    // After a block tag or comment: `-` strips all whitespace, else trim_blocks drops one newline.
    size_t after_tag(size_t p, bool minus, bool trim) {
        if (minus) {
            while (p < src_.size() && is_space(src_[p])) ++p;
        } else if (trim) {
            if (p < src_.size() && src_[p] == '\n')
                ++p;
            else if (p + 1 < src_.size() && src_[p] == '\r' && src_[p + 1] == '\n')
                p += 2;
        }
        return p;
    }

    size_t lex_comment(size_t tag, size_t p) {
        const size_t end = src_.find("#}", p);
        if (end == std::string_view::npos) fail("unterminated comment", tag);
        const bool minus = end > p && src_[end - 1] == '-';
        return after_tag(end + 2, minus, opt_.trim_blocks);
    }

    // `{% raw %}` ... `{% endraw %}`: the text between is literal.
    bool try_raw(size_t tag, size_t p, size_t& next) {
        size_t q = p;
        while (q < src_.size() && is_space(src_[q])) ++q;
        if (src_.compare(q, 3, "raw") != 0 || (q + 3 < src_.size() && is_name_char(src_[q + 3]))) return false;
        q += 3;
        while (q < src_.size() && is_space(src_[q])) ++q;
        bool minus = false;
        if (q < src_.size() && src_[q] == '-') minus = true, ++q;
        if (src_.compare(q, 2, "%}") != 0) fail("expected '%}' after 'raw'", q);
        size_t body = after_tag(q + 2, minus, opt_.trim_blocks);
        // find {%[-+]? endraw [-]?%}
        size_t search = body;
        while (true) {
            const size_t b = src_.find("{%", search);
            if (b == std::string_view::npos) fail("missing '{% endraw %}'", tag);
            size_t r = b + 2;
            const bool lminus = r < src_.size() && src_[r] == '-';
            if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) ++r;
            while (r < src_.size() && is_space(src_[r])) ++r;
            if (src_.compare(r, 6, "endraw") != 0) {
                search = b + 2;
                continue;
            }
            r += 6;
            while (r < src_.size() && is_space(src_[r])) ++r;
            bool rminus = false;
            if (r < src_.size() && src_[r] == '-') rminus = true, ++r;
            if (src_.compare(r, 2, "%}") != 0) fail("expected '%}' after 'endraw'", r);
            std::string text(src_.substr(body, b - body));
            if (lminus) rstrip_all(text);
            push_text(std::move(text), body);
            next = after_tag(r + 2, rminus, opt_.trim_blocks);
            return true;
        }
    }

    size_t lex_block(size_t tag, size_t p) {
        size_t next = 0;
        if (try_raw(tag, p, next)) return next;
        tokens_.push_back({Tok::BlockBegin, "{%", static_cast<uint32_t>(tag)});
        return lex_inside(tag, p, false);
    }

    size_t lex_var(size_t tag, size_t p) {
        tokens_.push_back({Tok::VarBegin, "{{", static_cast<uint32_t>(tag)});
        return lex_inside(tag, p, true);
    }

    // Tokenises expression tokens up to the closing `}}` / `%}`; returns the position after it.
    size_t lex_inside(size_t tag, size_t p, bool var) {
        int braces = 0;
        while (true) {
            while (p < src_.size() && is_space(src_[p])) ++p;
            if (p >= src_.size()) fail(var ? "missing '}}'" : "missing '%}'", tag);
            const char c = src_[p];
            // closing tag, possibly with '-'
            if (var && braces == 0) {
                if (src_.compare(p, 3, "-}}") == 0) {
                    tokens_.push_back({Tok::VarEnd, "}}", static_cast<uint32_t>(p)});
                    return after_tag(p + 3, true, false);
                }
                if (src_.compare(p, 2, "}}") == 0) {
                    tokens_.push_back({Tok::VarEnd, "}}", static_cast<uint32_t>(p)});
                    return p + 2;
                }
            }
            if (!var) {
                if (src_.compare(p, 3, "-%}") == 0) {
                    tokens_.push_back({Tok::BlockEnd, "%}", static_cast<uint32_t>(p)});
                    return after_tag(p + 3, true, false);
                }
                if (src_.compare(p, 2, "%}") == 0) {
                    tokens_.push_back({Tok::BlockEnd, "%}", static_cast<uint32_t>(p)});
                    return after_tag(p + 2, false, opt_.trim_blocks);
                }
            }
            if (is_name_start(c)) {
                size_t e = p;
                while (e < src_.size() && is_name_char(src_[e])) ++e;
                tokens_.push_back({Tok::Name, std::string(src_.substr(p, e - p)), static_cast<uint32_t>(p)});
                p = e;
                continue;
            }
            if (is_digit(c)) {
                p = lex_number(p);
                continue;
            }
            if (c == '\'' || c == '"') {
                p = lex_string(p);
                continue;
            }
            static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "|",
                                               ".",  ",",  ":",  "(",  ")",  "[",  "]", "{", "}", "=", "<", ">"};
            bool matched = false;
            for (const char* op : kOps) {
                const size_t n = std::strlen(op);
                if (src_.compare(p, n, op) == 0) {
                    if (op[0] == '{' && n == 1) ++braces;
                    if (op[0] == '}' && n == 1) --braces;
                    tokens_.push_back({Tok::Op, op, static_cast<uint32_t>(p)});
                    p += n;
                    matched = true;
                    break;
                }
            }
            if (!matched) fail(std::string("unexpected character '") + c + "'", p);
        }
    }

    size_t lex_number(size_t p) {
        size_t e = p;
        auto digits = [&] {
            while (e < src_.size() &&
                   (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && is_digit(src_[e + 1]))))
                ++e;
        };
        digits();
        bool is_float = false;
        // a fraction, unless this number is an attribute index (`x.0.1`) or the dot starts a name
        const bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::Op && tokens_.back().value == ".";
        if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
            ++e;
            digits();
            is_float = true;
        }
        if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
            size_t f = e + 1;
            if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
            if (f < src_.size() && is_digit(src_[f])) {
                e = f;
                digits();
                is_float = true;
            }
        }
        std::string text;
        for (size_t i = p; i < e; ++i)
            if (src_[i] != '_') text += src_[i];
        tokens_.push_back({is_float ? Tok::Float : Tok::Int, std::move(text), static_cast<uint32_t>(p)});
        return e;
    }

    static int hex_value(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    }

    // Python string literal escapes; an unknown escape keeps its backslash (as Python does).
    size_t lex_string(size_t p) {
        const char q = src_[p];
        std::string out;
        size_t i = p + 1;
        while (true) {
            if (i >= src_.size()) fail("unterminated string literal", p);
            const char c = src_[i];
            if (c == q) break;
            if (c != '\\') {
                out += c;
                ++i;
                continue;
            }
            if (i + 1 >= src_.size()) fail("unterminated string literal", p);
            const char e = src_[i + 1];
            i += 2;
            switch (e) {
                case 'n':
                    out += '\n';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'v':
                    out += '\v';
                    break;
                case 'a':
                    out += '\a';
                    break;
                case '0':
                    out += '\0';
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '\'':
                    out += '\'';
                    break;
                case '"':
                    out += '"';
                    break;
                case '\n':
                    break;  // line continuation
                case 'x':
                case 'u':
                case 'U': {
                    const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                    uint32_t cp = 0;
                    for (int k = 0; k < n; ++k) {
                        const int h = i + k < src_.size() ? hex_value(src_[i + k]) : -1;
                        if (h < 0) fail(std::string("truncated \\") + e + " escape", i - 2);
                        cp = cp * 16 + static_cast<uint32_t>(h);
                    }
                    if (cp > 0x10FFFF) fail("escape outside the Unicode range", i - 2);
                    i += n;
                    utf8::append(out, cp);
                    break;
                }
                default:
                    out += '\\';
                    out += e;
            }
        }
        tokens_.push_back({Tok::String, std::move(out), static_cast<uint32_t>(p)});
        return i + 1;
    }

    std::string_view src_;
    LexOptions opt_;
    std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& opt) {
    return Lexer(source, opt).run();
}

std::pair<int, int> line_col(std::string_view source, uint32_t offset) {
    int line = 1, col = 1;
    for (size_t i = 0; i < offset && i < source.size(); ++i) {
        if (source[i] == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
    }
    return {line, col};
}

}  // namespace peregrine::jinja
