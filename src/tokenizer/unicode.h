// UTF-8 helpers for the tokenizer: validation with replacement, GPT-2's byte-to-unicode
// alphabet, and Unicode normalization (NFC/NFKC/NFD/NFKD through ICU).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace peregrine::utf8 {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// The length of the UTF-8 sequence a lead byte announces (1 for ASCII and for bytes that
// cannot start a sequence, so that a byte walk always advances).
inline int seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1;
}

// What lies at s[0..n): a well-formed character of `len` bytes, an ill-formed one (`len` is
// the maximal subpart to replace by one U+FFFD, as Unicode and WHATWG recommend), or the
// valid start of a character that the end of the input cuts (`len` = n).
enum class Utf8Status { Valid, Invalid, Incomplete };
Utf8Status next_char(const char* s, size_t n, size_t* len);

// Decodes the well-formed character at s (see next_char) into a code point.
uint32_t decode(const char* s, size_t len);
// Appends the UTF-8 encoding of `cp` (which must be a scalar value).
void append(std::string& out, uint32_t cp);

bool is_valid(std::string_view s);
// `s` with every ill-formed sequence replaced by U+FFFD (a cut character at the end too).
std::string sanitize(std::string_view s);
// Moves the longest prefix of `pending` that holds only whole characters (ill-formed
// sequences replaced by U+FFFD) to the end of `out`; a character still cut at the end stays
// in `pending`. With `final`, a cut character is replaced too and `pending` ends empty.
void take_complete(std::string& pending, std::string& out, bool final = false);

// GPT-2's byte-level alphabet: every byte maps to a printable code point (printable Latin-1
// bytes to themselves, the others to U+0100 upwards in byte order).
uint32_t byte_to_code_point(uint8_t b);
// The byte a code point stands for, or -1 when it is not in the alphabet.
int code_point_to_byte(uint32_t cp);
// Bytes → their byte-level form ("Ġ" for a space, ...).
std::string byte_level_encode(std::string_view bytes);
// Byte-level form → bytes; false when a character is outside the alphabet (out is then
// unspecified).
bool byte_level_decode(std::string_view text, std::string& out);

enum class NormalForm { None, NFC, NFKC, NFD, NFKD };
// `s` (valid UTF-8) in normal form `form`. ASCII text is returned as is without a copy of
// the tables being touched.
std::string normalize(std::string_view s, NormalForm form);
bool is_ascii(std::string_view s);

}  // namespace peregrine::utf8
