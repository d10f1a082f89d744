#include "template/text.h"
#include "tokenizer/unicode.h"

#include <algorithm>
#include <cstdint>

namespace peregrine::jinja::text {

namespace {

size_t seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c >> 5) == 0x6) return 2;
    if ((c >> 4) == 0xE) return 3;
    if ((c >> 3) == 0x1E) return 4;
    return 1;
}

// Decodes the code point of a character returned by chars(); invalid sequences give 0xFFFFFFFF.
uint32_t decode(std::string_view ch) {
    const auto c = static_cast<unsigned char>(ch[0]);
    if (ch.size() == 1) return c < 0x80 ? c : 0xFFFFFFFF;
    uint32_t cp = ch.size() == 2 ? (c & 0x1F) : ch.size() == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < ch.size(); ++i) cp = (cp << 6) | (static_cast<unsigned char>(ch[i]) & 0x3F);
    return cp;
}

uint32_t to_upper_cp(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c - 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
    if (c == 0x17F) return 'S';
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c >= 0x3AC && c <= 0x3AF) return c == 0x3AC ? 0x386 : c - 37;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}

uint32_t to_lower_cp(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c : c + 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

bool is_letter_cp(uint32_t c) {
    return to_upper_cp(c) != c || to_lower_cp(c) != c || c == 0xDF;
}

template <typename F>
std::string map_chars(std::string_view s, F&& f) {
    std::string out;
    out.reserve(s.size());
    size_t index = 0;
    for (std::string_view ch : chars(s)) {
        const uint32_t cp = decode(ch);
        if (cp == 0xFFFFFFFF) {
            out.append(ch);
        } else {
            f(out, cp, index);
        }
        ++index;
    }
    return out;
}

void put_upper(std::string& out, uint32_t cp) {
    if (cp == 0xDF) {
        out += "SS";
        return;
    }
    utf8::append(out, to_upper_cp(cp));
}

}  // namespace

std::vector<std::string_view> chars(std::string_view s) {
    std::vector<std::string_view> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        size_t n = seq_len(static_cast<unsigned char>(s[i]));
        if (i + n > s.size()) n = 1;
        for (size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
        out.push_back(s.substr(i, n));
        i += n;
    }
    return out;
}

size_t num_chars(std::string_view s) {
    if (is_ascii(s)) return s.size();
    return chars(s).size();
}

bool is_ascii(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::string upper(std::string_view s) {
    return map_chars(s, [](std::string& out, uint32_t cp, size_t) { put_upper(out, cp); });
}

std::string lower(std::string_view s) {
    return map_chars(s, [](std::string& out, uint32_t cp, size_t) { utf8::append(out, to_lower_cp(cp)); });
}

bool has_cased(std::string_view s, bool want_upper) {
    for (std::string_view ch : chars(s)) {
        const uint32_t cp = decode(ch);
        if (cp == 0xFFFFFFFF) continue;
        if (want_upper ? to_lower_cp(cp) != cp : to_upper_cp(cp) != cp) return true;
    }
    return false;
}

std::string capitalize(std::string_view s) {
    return map_chars(s, [](std::string& out, uint32_t cp, size_t i) {
        if (i == 0)
            put_upper(out, cp);
        else
            utf8::append(out, to_lower_cp(cp));
    });
}

std::string title(std::string_view s) {
    bool prev_letter = false;
    return map_chars(s, [&](std::string& out, uint32_t cp, size_t) {
        const bool letter = is_letter_cp(cp);
        if (letter && !prev_letter)
            put_upper(out, cp);
        else if (letter)
            utf8::append(out, to_lower_cp(cp));
        else
            utf8::append(out, cp);
        prev_letter = letter;
    });
}

std::string jinja_title(std::string_view s) {
    bool word_start = true;
    return map_chars(s, [&](std::string& out, uint32_t cp, size_t) {
        const bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' ||
                         (cp < 0x80 && is_py_space(static_cast<char>(cp)));
        if (sep) {
            utf8::append(out, cp);
            word_start = true;
        } else if (word_start) {
            put_upper(out, cp);
            word_start = false;
        } else {
            utf8::append(out, to_lower_cp(cp));
        }
    });
}

bool is_py_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1F);
}

std::string_view strip(std::string_view s, const std::string* set, bool left, bool right) {
    auto strip_it = [&](char c) { return set ? set->find(c) != std::string::npos : is_py_space(c); };
    size_t b = 0, e = s.size();
    if (left)
        while (b < e && strip_it(s[b])) ++b;
    if (right)
        while (e > b && strip_it(s[e - 1])) --e;
    return s.substr(b, e - b);
}

std::vector<std::string> split(std::string_view s, const std::string* sep, long maxsplit) {
    std::vector<std::string> out;
    if (!sep) {
        size_t i = 0;
        while (true) {
            while (i < s.size() && is_py_space(s[i])) ++i;
            if (i >= s.size()) break;
            if (maxsplit >= 0 && static_cast<long>(out.size()) >= maxsplit) {
                out.emplace_back(s.substr(i));
                break;
            }
            size_t j = i;
            while (j < s.size() && !is_py_space(s[j])) ++j;
            out.emplace_back(s.substr(i, j - i));
            i = j;
        }
        return out;
    }
    size_t start = 0;
    while (true) {
        if (maxsplit >= 0 && static_cast<long>(out.size()) >= maxsplit) break;
        const size_t k = s.find(*sep, start);
        if (k == std::string_view::npos) break;
        out.emplace_back(s.substr(start, k - start));
        start = k + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, long maxsplit) {
    if (maxsplit < 0) return split(s, sep, maxsplit);
    std::vector<std::string> out;
    if (!sep) {
        size_t e = s.size();
        while (true) {
            while (e > 0 && is_py_space(s[e - 1])) --e;
            if (e == 0) break;
            if (static_cast<long>(out.size()) >= maxsplit) {
                out.emplace_back(s.substr(0, e));
                break;
            }
            size_t b = e;
            while (b > 0 && !is_py_space(s[b - 1])) --b;
            out.emplace_back(s.substr(b, e - b));
            e = b;
        }
    } else {
        size_t end = s.size();
        while (static_cast<long>(out.size()) < maxsplit && end >= sep->size()) {
            const size_t k = s.rfind(*sep, end - sep->size());
            if (k == std::string_view::npos) break;
            out.emplace_back(s.substr(k + sep->size(), end - k - sep->size()));
            end = k;
        }
        out.emplace_back(s.substr(0, end));
    }
    std::reverse(out.begin(), out.end());
    return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, long count) {
    std::string out;
    if (from.empty()) {  // Python inserts `to` around every character
        const auto cs = chars(s);
        long done = 0;
        for (std::string_view ch : cs) {
            if (count < 0 || done < count) {
                out.append(to);
                ++done;
            }
            out.append(ch);
        }
        if (count < 0 || done < count) out.append(to);
        return out;
    }
    size_t start = 0;
    long done = 0;
    while (count < 0 || done < count) {
        const size_t k = s.find(from, start);
        if (k == std::string_view::npos) break;
        out.append(s.substr(start, k - start));
        out.append(to);
        start = k + from.size();
        ++done;
    }
    out.append(s.substr(start));
    return out;
}

}  // namespace peregrine::jinja::text
