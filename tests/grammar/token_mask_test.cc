// The allowed-token mask on real vocabularies: equal to a brute-force check of every token,
// EOS and special tokens handled, rollback, and schema-valid JSON from random walks.
#include <gtest/gtest.h>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar_test_util.h"
#include "hf_vocab.h"
#include "support/sanitized.h"

namespace peregrine::grammar {
namespace {

using testing::allowed;

using testing::llama3_index;
using testing::stories_index;
using testing::tokenized;

// Every token the mask allows is accepted and every token it refuses is refused, checked by
// feeding each token to a copy of the state (brute force), along a random walk.
void expect_mask_exact(const std::shared_ptr<const TokenizedGrammar>& tg, uint32_t seed, int steps) {
    const Vocabulary& v = tg->vocab().vocab;
    std::mt19937 rng(seed);
    GrammarMatcher m(tg);
    std::vector<uint32_t> mask(v.mask_words());
    for (int step = 0; step < steps && !m.is_terminated(); ++step) {
        m.fill_next_token_bitmask(mask);
        std::vector<int32_t> ok;
        for (int32_t id = 0; id < int32_t(v.size()); ++id) {
            bool accepted = m.accept_token(id);
            if (accepted) {
                m.rollback(1);
                ok.push_back(id);
            }
            ASSERT_EQ(accepted, allowed(mask, id))
                << "token " << id << " '" << v.tokens[size_t(id)] << "' at step " << step;
        }
        ASSERT_FALSE(ok.empty());
        int32_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
        // Prefer not to end early so that the walk covers more of the grammar.
        if (ok.size() > 1 && std::find(v.eos.begin(), v.eos.end(), pick) != v.eos.end()) pick = ok[0];
        ASSERT_TRUE(m.accept_token(pick));
    }
}

TEST(GrammarTokenMask, ExactOnSmallVocabulary) {
    auto v = stories_index();
    expect_mask_exact(tokenized(compile_regex(R"([a-z ]{0,12}(\d+|x)!)"), v), 1, 30);
    expect_mask_exact(tokenized(compile_gbnf(R"G(root ::= "(" list ")"
list ::= item ("," " "? item)*
item ::= [a-z]+ | "(" list ")")G"),
                                v),
                      2, 40);
    const char* schema = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "tags": {"type": "array",
        "items": {"enum": ["a", "bb", "once upon"]}}, "child": {"$ref": "#"}}, "required": ["name"]})";
    for (uint32_t seed = 0; seed < 4; ++seed)
        expect_mask_exact(tokenized(compile_json_schema_text(schema), v), seed, 60);
    expect_mask_exact(tokenized(compile_any_json_object(), v), 9, 60);
}

TEST(GrammarTokenMask, ExactOnLlama3Vocabulary) {
    auto v = llama3_index();
    const char* schema = R"({"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city", "unit"]})";
    expect_mask_exact(tokenized(compile_json_schema_text(schema), v), 3, 12);
    expect_mask_exact(tokenized(compile_any_json_object(), v), 4, 10);
}

TEST(GrammarTokenMask, EosOnlyWhenCompleteAndSpecialNever) {
    auto v = llama3_index();
    auto tg = tokenized(compile_regex("ab|abc"), v);
    const Vocabulary& voc = v->vocab;
    GrammarMatcher m(tg);
    std::vector<uint32_t> mask(voc.mask_words());
    m.fill_next_token_bitmask(mask);
    for (int32_t e : voc.eos) EXPECT_FALSE(allowed(mask, e));
    ASSERT_TRUE(m.accept_string("ab"));
    EXPECT_TRUE(m.is_completed());
    m.fill_next_token_bitmask(mask);
    for (int32_t e : voc.eos) EXPECT_TRUE(allowed(mask, e));
    for (size_t id = 0; id < voc.size(); ++id) {
        if (voc.special[id] && std::find(voc.eos.begin(), voc.eos.end(), int32_t(id)) == voc.eos.end()) {
            EXPECT_FALSE(allowed(mask, int32_t(id))) << id;
        }
    }
    // 'c' is the only other byte: exactly the tokens "c".
    int count = 0;
    for (size_t id = 0; id < voc.size(); ++id) count += allowed(mask, int32_t(id));
    EXPECT_EQ(count, 1 + int(voc.eos.size()));
    ASSERT_TRUE(m.accept_token(voc.eos[0]));
    EXPECT_TRUE(m.is_terminated());
    m.fill_next_token_bitmask(mask);
    EXPECT_TRUE(std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }));
    EXPECT_FALSE(m.accept_token(voc.eos[0]));
    // Rollback over the EOS and one token.
    ASSERT_TRUE(m.rollback(2));
    EXPECT_FALSE(m.is_terminated());
    EXPECT_FALSE(m.is_completed());
    EXPECT_TRUE(m.accept_string("ab"));
    EXPECT_FALSE(m.rollback(5));
}

TEST(GrammarTokenMask, RandomWalksProduceSchemaValidJson) {
    auto v = llama3_index();
    nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 40},
            "filters": {"type": "array", "maxItems": 3, "items": {"type": "object",
                "properties": {"field": {"enum": ["date", "author", "lang"]}, "value": {"type": ["string", "number"]}},
                "required": ["field", "value"]}},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            "when": {"type": "string", "format": "date"}
        },
        "required": ["query"]})");
    auto tg = tokenized(compile_json_schema(schema), v);
    std::mt19937 rng(7);
    for (int i = 0; i < full_or_sanitized(20, 5); ++i) {
        std::string text = testing::random_walk(tg, rng, 20);
        nlohmann::ordered_json j;
        ASSERT_NO_THROW(j = nlohmann::ordered_json::parse(text)) << text;
        EXPECT_EQ(testing::check_schema(j, schema, schema), "") << text;
    }
}

}  // namespace
}  // namespace peregrine::grammar
