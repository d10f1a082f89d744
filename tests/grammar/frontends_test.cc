// Regex, GBNF and choice front ends, and the automaton's checks, at the byte level.
#include <chrono>

#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/gbnf.h"
#include "grammar/regex.h"
#include "grammar/utf8.h"
#include "grammar_test_util.h"

namespace peregrine::grammar {
namespace {

using testing::full_match;

TEST(GrammarRegex, LiteralsClassesQuantifiers) {
    CompiledGrammar g = compile_grammar(compile_regex(R"(^[a-c]+x{2,3}(ab|cd)?\d*$)"));
    EXPECT_TRUE(full_match(g, "axx"));
    EXPECT_TRUE(full_match(g, "abcxxxcd42"));
    EXPECT_FALSE(full_match(g, "axxxx"));
    EXPECT_FALSE(full_match(g, "xx"));
    EXPECT_FALSE(full_match(g, "axxab4c"));
}

TEST(GrammarRegex, EscapesDotAndNegation) {
    CompiledGrammar g = compile_grammar(compile_regex(R"(\w+\s\.[^0-9\n]\x41\u00e9.)"));
    EXPECT_TRUE(full_match(g, "ab_1 .zAé!"));
    EXPECT_TRUE(full_match(g, "a\t.%Aé€"));  // '.' takes a 3-byte character
    EXPECT_FALSE(full_match(g, "a .5Aé!"));
    EXPECT_FALSE(full_match(g, "a .zAé\n"));
}

TEST(GrammarRegex, UnicodeRanges) {
    CompiledGrammar g = compile_grammar(compile_regex("[а-я]{2}[😀-😊]"));
    EXPECT_TRUE(full_match(g, "жи😃"));
    EXPECT_FALSE(full_match(g, "жи😋"));
    EXPECT_FALSE(full_match(g, "ж😃"));
    // Every code point of a range, across UTF-8 length boundaries.
    CompiledGrammar wide = compile_grammar(compile_regex("[\\u0070-\\u{10FFFF}]"));
    for (uint32_t cp : {0x70u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
        std::string s;
        append_utf8(s, cp);
        EXPECT_TRUE(full_match(wide, s)) << std::hex << cp;
    }
    std::string sur = "\xED\xA0\x80";  // U+D800 is not a character
    EXPECT_FALSE(full_match(wide, sur));
    EXPECT_FALSE(full_match(wide, "o"));
}

TEST(GrammarRegex, BoundedRepetitionAndLazy) {
    CompiledGrammar g = compile_grammar(compile_regex("(?:ab){0,2}?c{3}d{2,}"));
    EXPECT_TRUE(full_match(g, "cccdd"));
    EXPECT_TRUE(full_match(g, "ababcccddd"));
    EXPECT_FALSE(full_match(g, "abababcccdd"));
    EXPECT_FALSE(full_match(g, "cccd"));
    EXPECT_TRUE(full_match(compile_regex("a{,2}"), "a{,2}"));  // not a quantifier: literal
}

TEST(GrammarRegex, UnsupportedConstructsNameThemselves) {
    auto message = [](const char* re) {
        try {
            compile_regex(re);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message(R"((a)\1)").find("backreference"), std::string::npos);
    EXPECT_NE(message("(?=a)b").find("lookaround"), std::string::npos);
    EXPECT_NE(message(R"(\bword)").find("word boundary"), std::string::npos);
    EXPECT_NE(message(R"(\p{L})").find("property"), std::string::npos);
    EXPECT_NE(message("a^b").find("anchor"), std::string::npos);
    EXPECT_NE(message("(ab").find("missing ')'"), std::string::npos);
    EXPECT_NE(message("*a").find("nothing to repeat"), std::string::npos);
}

TEST(GrammarChoice, ExactlyOneChoice) {
    CompiledGrammar g = compile_grammar(compile_choice({"red", "green", "greenish", ""}));
    EXPECT_TRUE(full_match(g, "green"));
    EXPECT_TRUE(full_match(g, "greenish"));
    EXPECT_TRUE(full_match(g, ""));
    EXPECT_FALSE(full_match(g, "gree"));
    EXPECT_FALSE(full_match(g, "redgreen"));
}

TEST(GrammarGbnf, ArithmeticAndComments) {
    const char* text = R"G(
        # arithmetic, llama.cpp style
        root ::= expr
        expr ::= term (("+" | "-") term)*
        term ::= factor ("*" factor)*
        factor ::= [0-9]+ | "(" expr ")"
          | "-" factor
    )G";
    CompiledGrammar g = compile_grammar(compile_gbnf(text));
    EXPECT_TRUE(full_match(g, "1+2*(3-4)"));
    EXPECT_TRUE(full_match(g, "--7"));
    EXPECT_FALSE(full_match(g, "1+"));
    EXPECT_FALSE(full_match(g, "(1"));
}

TEST(GrammarGbnf, EscapesClassesRepetitionAny) {
    const char* text = R"(root ::= "\"" [^"\\\n]{1,3} "\"" ws item{2} . [\u00e0-\u00ff]
ws ::= [ \t]*
item ::= "x" | "\x79")";
    CompiledGrammar g = compile_grammar(compile_gbnf(text));
    EXPECT_TRUE(full_match(g, "\"ab\" xy!é"));
    EXPECT_TRUE(full_match(g, "\"a\"yy€à"));
    EXPECT_FALSE(full_match(g, "\"abcd\"xy!é"));
    EXPECT_FALSE(full_match(g, "\"\"xy!é"));
}

TEST(GrammarGbnf, Errors) {
    auto message = [](const char* text) {
        try {
            compile_grammar(compile_gbnf(text));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message("start ::= \"a\"").find("no 'root' rule"), std::string::npos);
    EXPECT_NE(message("root ::= missing").find("'missing'"), std::string::npos);
    EXPECT_NE(message("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
    EXPECT_NE(message("root ::= root \"a\" | \"b\"").find("left recursion"), std::string::npos);
    EXPECT_NE(message("root ::= x \"a\"\nx ::= \"\" | root").find("left recursion"), std::string::npos);
    EXPECT_NE(message("root ::= \"a\" root").find("matches no string"), std::string::npos);
    EXPECT_NE(message("root ::= \"abc").find("unterminated"), std::string::npos);
}

TEST(GrammarLimits, PathologicalRepetitionFailsFast) {
    auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(compile_grammar(compile_regex("((a{1000}){1000}){1000}")), Error);
    EXPECT_THROW(compile_grammar(compile_regex("(a?){100000}")), Error);
    try {
        compile_grammar(compile_regex("(x{0,500}y){0,500}"));
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(s, 5.0);
}

}  // namespace
}  // namespace peregrine::grammar
