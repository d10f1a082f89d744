// Unicode code point sets as UTF-8 byte automata: a class like [a-zé-ü] or "any character"
// becomes an alternation of byte-range sequences (the standard split of a code point range at
// the UTF-8 length and continuation-byte boundaries), so the matcher stays byte-level.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace peregrine::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Inclusive code point ranges, kept sorted and disjoint by normalize().
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

void normalize(CodePointRanges& ranges);
// Everything in [0, kMaxCodePoint] not in `ranges`, surrogates excluded.
CodePointRanges complement(const CodePointRanges& ranges);

// An expression matching exactly one code point of `ranges` in UTF-8 (surrogates never match).
// An empty set compiles to a byte set that matches nothing is not allowed: throws Error.
int utf8_class(Grammar& g, CodePointRanges ranges);

// Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string& out, uint32_t cp);
// Decodes one code point at `s[pos]`, advancing pos; throws Error on malformed UTF-8.
uint32_t decode_utf8(const std::string& s, size_t& pos);

}  // namespace peregrine::grammar
