// Decimal numbers within bounds as grammar expressions (JSON Schema minimum / maximum).
#pragma once

#include <cstdint>
#include <optional>

#include "grammar/grammar.h"

namespace peregrine::grammar {

// Integers in [lo, hi] (either side may be open) in JSON spelling: an optional '-', no leading
// zeros, no "-0". Built digit-wise (exact); an open side stops at 16 digits (or one more than the
// other bound has), so that a double holds it. Throws Error when the range is empty.
int integer_range(Grammar& g, std::optional<int64_t> lo, std::optional<int64_t> hi);

// JSON numbers x with lo <= x <= hi (strict when `lo_open` / `hi_open`): the integers of the
// range plus decimals (no exponent) whose integer part keeps every fraction inside the range.
// Next to an open integer bound the fraction has at most 15 significant digits in all, so the
// value read as a double (as validators read it) is still strictly inside: "0.000...01" cannot
// underflow to 0 for exclusiveMinimum 0, nor "4.999...9" round to 5 for exclusiveMaximum 5.
// Sound, not complete; see json_schema.h. Throws Error when the range holds no number.
int number_range(Grammar& g, std::optional<double> lo, bool lo_open, std::optional<double> hi, bool hi_open);

}  // namespace peregrine::grammar
