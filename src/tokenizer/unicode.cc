#include "tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include "core/error.h"

namespace peregrine::utf8 {

Utf8Status next_char(const char* s, size_t n, size_t* len) {
    const auto b0 = static_cast<unsigned char>(s[0]);
    if (b0 < 0x80) {
        *len = 1;
        return Utf8Status::Valid;
    }
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        need = 2;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
        need = 3;
        if (b0 == 0xe0) lo = 0xa0;
        if (b0 == 0xed) hi = 0x9f;  // no surrogates
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
        need = 4;
        if (b0 == 0xf0) lo = 0x90;
        if (b0 == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
    } else {
        *len = 1;
        return Utf8Status::Invalid;
    }
    for (size_t k = 1; k < need; ++k) {
        if (k >= n) {
            *len = n;
            return Utf8Status::Incomplete;
        }
        const auto b = static_cast<unsigned char>(s[k]);
        const bool ok = k == 1 ? (b >= lo && b <= hi) : (b & 0xc0) == 0x80;
        if (!ok) {
            *len = k;
            return Utf8Status::Invalid;
        }
    }
    *len = need;
    return Utf8Status::Valid;
}

uint32_t decode(const char* s, size_t len) {
    const auto b0 = static_cast<unsigned char>(s[0]);
    if (len == 1) return b0;
    uint32_t cp = b0 & (0x7f >> len);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3f);
    return cp;
}

void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xc0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xe0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
        out += static_cast<char>(0xf0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    }
}

bool is_ascii(std::string_view s) {
    for (char c : s)
        if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
}

bool is_valid(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        if (static_cast<unsigned char>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        size_t len;
        if (next_char(s.data() + i, s.size() - i, &len) != Utf8Status::Valid) return false;
        i += len;
    }
    return true;
}

std::string sanitize(std::string_view s) {
    std::string pending(s), out;
    out.reserve(s.size());
    take_complete(pending, out, true);
    return out;
}

void take_complete(std::string& pending, std::string& out, bool final) {
    size_t i = 0;
    const size_t n = pending.size();
    while (i < n) {
        // Copy runs of well-formed text at once.
        size_t j = i;
        size_t len = 0;
        Utf8Status st = Utf8Status::Valid;
        while (j < n) {
            if (static_cast<unsigned char>(pending[j]) < 0x80) {
                ++j;
                continue;
            }
            st = next_char(pending.data() + j, n - j, &len);
            if (st != Utf8Status::Valid) break;
            j += len;
        }
        out.append(pending, i, j - i);
        i = j;
        if (i == n) break;
        if (st == Utf8Status::Incomplete && !final) break;
        out += kReplacementChar;
        i += len;
    }
    pending.erase(0, i);
}

namespace {

struct ByteLevelTables {
    std::array<uint32_t, 256> byte_to_cp;
    std::array<int16_t, 324> cp_to_byte;  // the alphabet's code points are all below 0x144
    std::array<std::string, 256> encoded;
    ByteLevelTables() {
        cp_to_byte.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            byte_to_cp[b] = printable ? b : next++;
            cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
            append(encoded[b], byte_to_cp[b]);
        }
    }
};

const ByteLevelTables& byte_level_tables() {
    static const ByteLevelTables t;
    return t;
}

}  // namespace

uint32_t byte_to_code_point(uint8_t b) {
    return byte_level_tables().byte_to_cp[b];
}

int code_point_to_byte(uint32_t cp) {
    const auto& t = byte_level_tables();
    return cp < t.cp_to_byte.size() ? t.cp_to_byte[cp] : -1;
}

std::string byte_level_encode(std::string_view bytes) {
    const auto& t = byte_level_tables();
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) out += t.encoded[static_cast<unsigned char>(c)];
    return out;
}

bool byte_level_decode(std::string_view text, std::string& out) {
    out.clear();
    for (size_t i = 0; i < text.size();) {
        size_t len;
        if (next_char(text.data() + i, text.size() - i, &len) != Utf8Status::Valid) return false;
        const int b = code_point_to_byte(decode(text.data() + i, len));
        if (b < 0) return false;
        out += static_cast<char>(b);
        i += len;
    }
    return true;
}

std::string normalize(std::string_view s, NormalForm form) {
    if (form == NormalForm::None || is_ascii(s)) return std::string(s);
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = nullptr;
    switch (form) {
        case NormalForm::NFC:
            n = icu::Normalizer2::getNFCInstance(status);
            break;
        case NormalForm::NFKC:
            n = icu::Normalizer2::getNFKCInstance(status);
            break;
        case NormalForm::NFD:
            n = icu::Normalizer2::getNFDInstance(status);
            break;
        case NormalForm::NFKD:
            n = icu::Normalizer2::getNFKDInstance(status);
            break;
        case NormalForm::None:
            break;
    }
    if (U_FAILURE(status) || n == nullptr) fail("unicode normalization unavailable: ", u_errorName(status));
    const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
    if (n->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return std::string(s);
    status = U_ZERO_ERROR;
    std::string out;
    out.reserve(s.size() + s.size() / 8);
    icu::StringByteSink<std::string> sink(&out);
    n->normalizeUTF8(0, piece, sink, nullptr, status);
    if (U_FAILURE(status)) fail("unicode normalization failed: ", u_errorName(status));
    return out;
}

}  // namespace peregrine::utf8
