// JSON Schema (OpenAI `response_format` json_schema, tool parameters) compiled into a Grammar
// whose sentences are the JSON texts the schema accepts (within the approximations below).
//
// Supported: type (object, array, string, number, integer, boolean, null, and lists of them);
// enum, const; properties (emitted in schema order; required ones always, optional ones as any
// subset), required (a required name without a `properties` entry takes the
// additionalProperties schema, or any value), additionalProperties false / true / a schema
// (additional keys come after the listed ones; their names are any string, not checked against
// the listed names); items, prefixItems, items: false, minItems, maxItems; minLength,
// maxLength, pattern (regex.h; matched against the whole string, as xgrammar and outlines do);
// format date, time, date-time, duration-free RFC 3339 subsets, uuid, email, ipv4, uri,
// hostname; minimum, maximum, exclusiveMinimum, exclusiveMaximum (draft 4 booleans too) for
// integers, exact (digit-wise ranges); anyOf, oneOf (as anyOf: exclusivity is not enforced),
// allOf (merged when the branches do not conflict, else an Error); $ref to "#", "#/$defs/...",
// "#/definitions/..." or any local JSON pointer, recursion included; boolean schemas;
// annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly) are ignored.
//
// Approximations (documented, always on the safe side: every produced text is valid):
//   - number with bounds: no exponent; the integer part is bounded so that every fraction stays
//     inside the range (e.g. minimum 0.5 allows 1, 1.25, but not 0.75);
//   - integer bounds beyond +-1e18 count as unbounded;
//   - exponents have at most two digits (1e400 is valid JSON but overflows a double in common
//     parsers);
//   - whitespace: the compact form, plus at most `max_whitespace` bytes of [ \t\n\r] after
//     '{' '[' ',' ':' and before '}' ']' ',' ':' (bounded so a model cannot loop on blanks);
//   - without additionalProperties, `strict_properties` (default true, as OpenAI strict mode
//     and xgrammar) allows no other keys; false allows any others (JSON Schema's default).
// Everything else (multipleOf, uniqueItems: true, contains, minProperties, patternProperties,
// if/then/else, not, dependentRequired, unknown formats, external $refs, ...) is refused with an
// Error whose message names the keyword and where it is.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace peregrine::grammar {

struct JsonSchemaOptions {
    int max_whitespace = 20;  // 0: compact only
    bool strict_properties = true;
    size_t max_exprs = 2'000'000;  // grammar expressions before compilation gives up
};

Grammar compile_json_schema(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
// The same from text (a parse error is an Error).
Grammar compile_json_schema_text(std::string_view schema_text, const JsonSchemaOptions& options = {});
// `{"type": "json_object"}`: any JSON object.
Grammar compile_any_json_object(const JsonSchemaOptions& options = {});

}  // namespace peregrine::grammar
