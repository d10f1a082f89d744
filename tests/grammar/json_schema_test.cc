// JSON Schema front end at the byte level: what each keyword accepts and refuses.
#include <chrono>

#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar_test_util.h"

namespace peregrine::grammar {
namespace {

using testing::full_match;

CompiledGrammar schema(const std::string& text, JsonSchemaOptions o = {}) {
    return compile_grammar(compile_json_schema_text(text, o));
}

std::string error_of(const std::string& text) {
    try {
        compile_grammar(compile_json_schema_text(text));
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

TEST(GrammarJsonSchema, Scalars) {
    auto g = schema(R"({"type": ["string", "null", "boolean"]})");
    EXPECT_TRUE(full_match(g, R"("a\"b\\c\u00e9\n")"));
    EXPECT_TRUE(full_match(g, "null"));
    EXPECT_TRUE(full_match(g, "false"));
    EXPECT_FALSE(full_match(g, "\"a\nb\""));     // raw control character
    EXPECT_FALSE(full_match(g, R"("\ud800")"));  // lone surrogate escape
    EXPECT_FALSE(full_match(g, "1"));
    auto n = schema(R"({"type": "number"})");
    for (const char* ok : {"0", "-0", "12.5e-3", "1E+9", "-7.25"}) EXPECT_TRUE(full_match(n, ok)) << ok;
    for (const char* bad : {"01", "1.", ".5", "+1", "1e"}) EXPECT_FALSE(full_match(n, bad)) << bad;
}

TEST(GrammarJsonSchema, IntegerRangesAreExact) {
    auto g = schema(R"({"type": "integer", "minimum": -37, "maximum": 1204})");
    for (int x = -60; x <= 1300; ++x) EXPECT_EQ(full_match(g, std::to_string(x)), x >= -37 && x <= 1204) << x;
    EXPECT_FALSE(full_match(g, "-0"));
    EXPECT_FALSE(full_match(g, "007"));
    auto ex = schema(R"({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 100})");
    for (int x = 0; x <= 120; ++x) EXPECT_EQ(full_match(ex, std::to_string(x)), x > 9 && x < 100) << x;
    auto open = schema(R"({"type": "integer", "minimum": 95})");
    for (int x = 0; x <= 2000; ++x) EXPECT_EQ(full_match(open, std::to_string(x)), x >= 95) << x;
    EXPECT_TRUE(full_match(open, "123456789012"));
    auto neg = schema(R"({"type": "integer", "maximum": -5})");
    EXPECT_TRUE(full_match(neg, "-5"));
    EXPECT_TRUE(full_match(neg, "-123456"));
    EXPECT_FALSE(full_match(neg, "-4"));
    EXPECT_FALSE(full_match(neg, "3"));
}

TEST(GrammarJsonSchema, NumberRangesStayInside) {
    auto g = schema(R"({"type": "number", "minimum": -2.5, "maximum": 3})");
    for (const char* ok : {"-2", "0", "3", "2.999", "-1.5", "-0.25"}) EXPECT_TRUE(full_match(g, ok)) << ok;
    for (const char* bad : {"3.5", "-3", "4", "1e2", "3.0001"}) EXPECT_FALSE(full_match(g, bad)) << bad;
}

TEST(GrammarJsonSchema, NumberOpenRanges) {
    auto unit = schema(R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})");
    for (const char* ok : {"0.5", "0.001", "0.9999"}) EXPECT_TRUE(full_match(unit, ok)) << ok;
    for (const char* bad : {"0", "1", "0.0", "0.000", "1.5", "-0.5"}) EXPECT_FALSE(full_match(unit, bad)) << bad;
    auto neg = schema(R"({"type": "number", "minimum": -3, "exclusiveMaximum": 0})");
    for (const char* ok : {"-3", "-2.5", "-0.5", "-1"}) EXPECT_TRUE(full_match(neg, ok)) << ok;
    for (const char* bad : {"0", "-0.0", "-3.5", "0.5"}) EXPECT_FALSE(full_match(neg, bad)) << bad;
}

TEST(GrammarJsonSchema, StringLengthPatternFormat) {
    auto g = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
    EXPECT_TRUE(full_match(g, "\"ab\""));
    EXPECT_TRUE(full_match(g, "\"é\\n€\""));
    EXPECT_FALSE(full_match(g, "\"a\""));
    EXPECT_FALSE(full_match(g, "\"abcd\""));
    auto p = schema(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})");
    EXPECT_TRUE(full_match(p, "\"AB-123\""));
    EXPECT_FALSE(full_match(p, "\"AB-12\""));
    auto q = schema(R"({"pattern": "a\"b\\\\c"})");  // the regex a"b\\c: a quote and a backslash
    EXPECT_TRUE(full_match(q, R"("a\"b\\c")"));
    auto d = schema(R"({"type": "string", "format": "date-time"})");
    EXPECT_TRUE(full_match(d, "\"2024-02-29T13:45:00Z\""));
    EXPECT_TRUE(full_match(d, "\"2024-02-29T13:45:00.123+05:30\""));
    EXPECT_FALSE(full_match(d, "\"2024-13-01T00:00:00Z\""));
    auto u = schema(R"({"format": "uuid"})");
    EXPECT_TRUE(full_match(u, "\"123e4567-e89b-12d3-a456-426614174000\""));
    auto e = schema(R"({"format": "email"})");
    EXPECT_TRUE(full_match(e, "\"jane.doe+x@mail.example.com\""));
    EXPECT_FALSE(full_match(e, "\"jane@\""));
}

TEST(GrammarJsonSchema, EnumAndConst) {
    auto g = schema(R"({"enum": ["a", 1, null, {"k": [true]}]})");
    for (const char* ok : {"\"a\"", "1", "null", R"({"k":[true]})"}) EXPECT_TRUE(full_match(g, ok)) << ok;
    EXPECT_FALSE(full_match(g, "\"b\""));
    auto c = schema(R"({"const": "fixed"})");
    EXPECT_TRUE(full_match(c, "\"fixed\""));
    EXPECT_FALSE(full_match(c, "\"fixe\""));
}

TEST(GrammarJsonSchema, PropertiesRequiredOptionalInOrder) {
    auto g = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                       "c": {"type": "boolean"}}, "required": ["b"]})");
    EXPECT_TRUE(full_match(g, R"({"b":"x"})"));
    EXPECT_TRUE(full_match(g, R"({"a":1,"b":"x"})"));
    EXPECT_TRUE(full_match(g, R"({"a":1,"b":"x","c":true})"));
    EXPECT_TRUE(full_match(g, R"({ "b" : "x" , "c" : false })"));
    EXPECT_TRUE(full_match(g, "{\n  \"b\": \"x\",\n  \"c\": false\n}"));
    EXPECT_FALSE(full_match(g, R"({"a":1})"));          // b missing
    EXPECT_FALSE(full_match(g, R"({"b":"x","a":1})"));  // out of schema order
    EXPECT_FALSE(full_match(g, R"({"b":"x","d":1})"));  // additional (strict default)
    EXPECT_FALSE(full_match(g, R"({,"b":"x"})"));
    auto all_optional = schema(R"({"properties": {"a": {}, "b": {}}})");
    EXPECT_TRUE(full_match(all_optional, "{}"));
    EXPECT_TRUE(full_match(all_optional, R"({"b":[1,{"x":null}]})"));
    EXPECT_FALSE(full_match(all_optional, R"({"a":1,})"));
}

TEST(GrammarJsonSchema, AdditionalProperties) {
    auto g = schema(R"({"properties": {"id": {"type": "integer"}}, "required": ["id"],
                       "additionalProperties": {"type": "string"}})");
    EXPECT_TRUE(full_match(g, R"({"id":1,"x":"y","z":"w"})"));
    EXPECT_FALSE(full_match(g, R"({"id":1,"x":2})"));
    auto open = schema(R"({"type": "object", "additionalProperties": true})");
    EXPECT_TRUE(full_match(open, R"({"q":[1,2,{"r":"s"}],"t":-1.5e3})"));
    JsonSchemaOptions lax;
    lax.strict_properties = false;
    auto loose = schema(R"({"properties": {"a": {"type": "integer"}}})", lax);
    EXPECT_TRUE(full_match(loose, R"({"a":1,"other":true})"));
}

TEST(GrammarJsonSchema, Arrays) {
    auto g = schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})");
    EXPECT_TRUE(full_match(g, "[1,2]"));
    EXPECT_TRUE(full_match(g, "[ 1 , 2 , 3 ]"));
    EXPECT_FALSE(full_match(g, "[1]"));
    EXPECT_FALSE(full_match(g, "[1,2,3,4]"));
    auto t = schema(R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})");
    EXPECT_TRUE(full_match(t, R"(["a",1])"));
    EXPECT_TRUE(full_match(t, R"(["a"])"));
    EXPECT_TRUE(full_match(t, "[]"));
    EXPECT_FALSE(full_match(t, R"(["a",1,2])"));
    EXPECT_FALSE(full_match(t, R"([1])"));
    auto tail = schema(R"({"prefixItems": [{"const": 0}], "items": {"type": "boolean"}, "minItems": 2})");
    EXPECT_TRUE(full_match(tail, "[0,true]"));
    EXPECT_TRUE(full_match(tail, "[0,true,false,true]"));
    EXPECT_FALSE(full_match(tail, "[0]"));
}

TEST(GrammarJsonSchema, CombinatorsAndRefs) {
    auto g = schema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})");
    EXPECT_TRUE(full_match(g, "5"));
    EXPECT_TRUE(full_match(g, "\"a\""));
    EXPECT_FALSE(full_match(g, "\"ab\""));
    auto all = schema(R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                     {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
    EXPECT_TRUE(full_match(all, R"({"a":1,"b":"x"})"));
    EXPECT_FALSE(full_match(all, R"({"a":1})"));
    // A recursive tree through $defs.
    auto tree = schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"]}}})");
    EXPECT_TRUE(full_match(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
    EXPECT_FALSE(full_match(tree, R"({"v":1,"kids":[{"w":2}]})"));
    auto root_ref = schema(R"({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                               "required": ["next"]})");
    EXPECT_TRUE(full_match(root_ref, R"({"next":{"next":{"next":null}}})"));
}

TEST(GrammarJsonSchema, JsonObjectMode) {
    auto g = compile_grammar(compile_any_json_object());
    EXPECT_TRUE(full_match(g, R"({"a":[1,2.5,"x",{"b":null}],"c":true})"));
    EXPECT_TRUE(full_match(g, "{}"));
    EXPECT_FALSE(full_match(g, "[]"));
    EXPECT_FALSE(full_match(g, R"({"a":})"));
}

TEST(GrammarJsonSchema, CompactWhitespace) {
    JsonSchemaOptions compact;
    compact.max_whitespace = 0;
    auto g = schema(R"({"properties": {"a": {"type": "integer"}}, "required": ["a"]})", compact);
    EXPECT_TRUE(full_match(g, R"({"a":1})"));
    EXPECT_FALSE(full_match(g, R"({"a": 1})"));
    auto bounded = schema(R"({"properties": {"a": {"type": "integer"}}, "required": ["a"]})");
    EXPECT_TRUE(full_match(bounded, "{\"a\":" + std::string(20, ' ') + "1}"));
    EXPECT_FALSE(full_match(bounded, "{\"a\":" + std::string(21, ' ') + "1}"));
}

TEST(GrammarJsonSchema, UnsupportedKeywordsNameThemselves) {
    EXPECT_NE(error_of(R"({"type": "integer", "multipleOf": 3})").find("'multipleOf'"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "object", "properties": {"a": {"not": {}}}})").find("'not' at #/properties/a"),
              std::string::npos);
    EXPECT_NE(error_of(R"({"type": "array", "uniqueItems": true})").find("'uniqueItems'"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "string", "format": "ipv6"})").find("ipv6"), std::string::npos);
    EXPECT_NE(error_of(R"({"$ref": "http://example.com/s.json"})").find("'$ref'"), std::string::npos);
    EXPECT_NE(error_of(R"({"$ref": "#/$defs/missing"})").find("cannot resolve"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "frog"})").find("unknown type 'frog'"), std::string::npos);
    EXPECT_NE(error_of(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})").find("'allOf'"), std::string::npos);
    EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
    EXPECT_NE(error_of(R"({"type": "string", "pattern": "(a)\\1"})").find("backreference"), std::string::npos);
}

TEST(GrammarJsonSchema, SizeCapFailsFast) {
    auto start = std::chrono::steady_clock::now();
    // Each definition uses the previous one twice: 2^40 copies if nothing stopped the expansion.
    std::string defs = R"("d0": {"type": "string", "maxLength": 5})";
    for (int i = 1; i <= 40; ++i) {
        std::string prev = "{\"$ref\": \"#/$defs/d" + std::to_string(i - 1) + "\"}";
        defs += ",\"d" + std::to_string(i) + "\": {\"prefixItems\": [" + prev + "," + prev + "]}";
    }
    std::string s = "{\"$ref\": \"#/$defs/d40\", \"$defs\": {" + defs + "}}";
    std::string msg = error_of(s);
    EXPECT_NE(msg.find("too large"), std::string::npos) << msg;
    std::string big = R"({"type": "string", "minLength": 90000, "maxLength": 100000})";
    EXPECT_NE(error_of(big).find("too large"), std::string::npos);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(sec, 10.0);
}

}  // namespace
}  // namespace peregrine::grammar
