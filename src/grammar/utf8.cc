#include "grammar/utf8.h"

#include <algorithm>

#include "core/error.h"

namespace peregrine::grammar {

void normalize(CodePointRanges& r) {
    std::sort(r.begin(), r.end());
    CodePointRanges out;
    for (auto [lo, hi] : r) {
        if (lo > hi) continue;
        if (!out.empty() && lo <= out.back().second + 1)
            out.back().second = std::max(out.back().second, hi);
        else
            out.emplace_back(lo, hi);
    }
    r = std::move(out);
}

CodePointRanges complement(const CodePointRanges& in) {
    CodePointRanges r = in;
    r.emplace_back(0xD800, 0xDFFF);  // surrogates are never characters
    normalize(r);
    CodePointRanges out;
    uint32_t next = 0;
    for (auto [lo, hi] : r) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

uint32_t decode_utf8(const std::string& s, size_t& pos) {
    auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
    uint8_t b0 = byte(pos);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos + static_cast<size_t>(len) > s.size()) fail("malformed UTF-8 in pattern at byte ", pos);
    uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < len; ++i) {
        uint8_t b = byte(pos + static_cast<size_t>(i));
        if ((b & 0xC0) != 0x80) fail("malformed UTF-8 in pattern at byte ", pos);
        cp = (cp << 6) | (b & 0x3F);
    }
    pos += static_cast<size_t>(len);
    return cp;
}

namespace {

// Appends, for the code points [lo, hi] all of one UTF-8 length, sequences of byte ranges that
// match exactly their encodings. Splits the range until every byte position is a full range.
void split(Grammar& g, uint32_t lo, uint32_t hi, std::vector<int>& out) {
    static constexpr uint32_t kLimits[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
    for (int n = 0; n < 3; ++n) {  // split at length boundaries
        if (lo <= kLimits[n] && hi > kLimits[n]) {
            split(g, lo, kLimits[n], out);
            split(g, kLimits[n] + 1, hi, out);
            return;
        }
    }
    if (hi < 0x80) {
        out.push_back(g.byte_range(uint8_t(lo), uint8_t(hi)));
        return;
    }
    // Split so that every continuation position spans its whole 0x80..0xBF range or one value.
    for (int i = 1; i < 4; ++i) {
        uint32_t m = (uint32_t{1} << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                split(g, lo, lo | m, out);
                split(g, (lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                split(g, lo, (hi & ~m) - 1, out);
                split(g, hi & ~m, hi, out);
                return;
            }
        }
    }
    std::string a, b;
    append_utf8(a, lo);
    append_utf8(b, hi);
    std::vector<int> items;
    for (size_t i = 0; i < a.size(); ++i) items.push_back(g.byte_range(uint8_t(a[i]), uint8_t(b[i])));
    out.push_back(g.seq(std::move(items)));
}

}  // namespace

int utf8_class(Grammar& g, CodePointRanges ranges) {
    normalize(ranges);
    // Surrogates are not characters.
    CodePointRanges clean;
    for (auto [lo, hi] : ranges) {
        if (hi > kMaxCodePoint) hi = kMaxCodePoint;
        if (lo > hi) continue;
        if (lo < 0xD800 && hi >= 0xD800) {
            clean.emplace_back(lo, 0xD7FF);
            if (hi > 0xDFFF) clean.emplace_back(0xE000, hi);
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            if (hi > 0xDFFF) clean.emplace_back(0xE000, hi);
        } else {
            clean.emplace_back(lo, hi);
        }
    }
    if (clean.empty()) fail("a character class that matches no character");
    // All single-byte code points go into one byte set.
    ByteSet ascii;
    std::vector<int> alts;
    for (auto [lo, hi] : clean) {
        if (hi < 0x80) {
            ascii.set_range(uint8_t(lo), uint8_t(hi));
            continue;
        }
        if (lo < 0x80) {
            ascii.set_range(uint8_t(lo), 0x7F);
            lo = 0x80;
        }
        split(g, lo, hi, alts);
    }
    if (!ascii.empty()) alts.insert(alts.begin(), g.bytes(ascii));
    return g.alt(std::move(alts));
}

}  // namespace peregrine::grammar
