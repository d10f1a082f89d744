// The schema corpus (tests/data/json-schemas/corpus.json, 100+ schemas: every supported keyword
// and real-world-shaped tool definitions): each compiles, and random walks through the token
// masks always end in JSON that parses and satisfies the schema, on the 512-token SentencePiece
// vocabulary of the embedded model (byte tokens: any text is reachable) and on Llama 3's.
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "grammar_test_util.h"
#include "hf_vocab.h"
#include "support/sanitized.h"

namespace peregrine::grammar {
namespace {

using Json = nlohmann::ordered_json;

const Json& corpus() {
    static const Json j = [] {
        std::ifstream in(std::string(PG_TEST_DATA_DIR) + "/json-schemas/corpus.json");
        return Json::parse(in);
    }();
    return j;
}

// The text parses as JSON and satisfies the schema.
void expect_valid(const std::string& name, const std::string& text, const Json& schema) {
    Json value;
    try {
        value = Json::parse(text);
    } catch (const std::exception& e) {
        ADD_FAILURE() << name << ": output does not parse: " << text << "\n" << e.what();
        return;
    }
    EXPECT_EQ(testing::check_schema(value, schema, schema), "") << name << ": " << text;
}

void walk_corpus(const std::shared_ptr<const VocabIndex>& vocab, int walks, int free_steps) {
    ASSERT_GE(corpus().size(), 100u);
    std::mt19937 rng(12345);
    for (const Json& entry : corpus()) {
        const std::string name = entry["name"];
        const Json& schema = entry["schema"];
        std::shared_ptr<const TokenizedGrammar> tg;
        try {
            tg = std::make_shared<const TokenizedGrammar>(compile_grammar(compile_json_schema(schema)), vocab);
        } catch (const std::exception& e) {
            ADD_FAILURE() << name << ": " << e.what();
            continue;
        }
        for (int w = 0; w < walks; ++w) {
            expect_valid(name, testing::random_walk(tg, rng, free_steps), schema);
        }
    }
}

TEST(GrammarSchemaCorpus, RandomWalksOnSmallVocabulary) {
    walk_corpus(std::make_shared<const VocabIndex>(testing::stories_vocab()), full_or_sanitized(4, 1), 40);
}

TEST(GrammarSchemaCorpus, RandomWalksOnLlama3Vocabulary) {
    walk_corpus(std::make_shared<const VocabIndex>(testing::llama3_vocab()), 1, 15);
}

// Within a token budget (fill_next_token_bitmask's tokens_left, what the engine passes from
// max_tokens): tokens drawn uniformly from the masks, no preference for closers, still end with
// EOS within the budget in JSON that satisfies the schema, whenever the budget fits the shortest
// document plus the EOS: at exactly that (the tightest), with 10 to spare, and at 120 tokens.
void budget_walks(const std::shared_ptr<const VocabIndex>& vocab, int walks, int max_budget) {
    std::mt19937 rng(777);
    int ended = 0, narrowed = 0, skipped = 0;
    for (const Json& entry : corpus()) {
        const std::string name = entry["name"];
        const Json& schema = entry["schema"];
        auto tg = std::make_shared<const TokenizedGrammar>(compile_grammar(compile_json_schema(schema)), vocab);
        const Vocabulary& v = vocab->vocab;
        const int64_t shortest = Parser(tg->grammar()).completion_bytes();
        for (int64_t budget : {shortest + 1, shortest + 11, int64_t(max_budget)}) {
            if (budget > max_budget) {
                ++skipped;
                continue;
            }
            for (int w = 0; w < walks; ++w) {
                GrammarMatcher m(tg);
                std::vector<uint32_t> mask(v.mask_words());
                std::string text;
                bool closed = false;
                for (int64_t used = 0; used < budget && !m.is_terminated(); ++used) {
                    closed |= m.fill_next_token_bitmask(mask, budget - used);
                    std::vector<int32_t> ids;
                    for (size_t i = 0; i < mask.size(); ++i)
                        for (uint32_t bits = mask[i]; bits; bits &= bits - 1)
                            ids.push_back(int32_t(i * 32 + size_t(__builtin_ctz(bits))));
                    ASSERT_FALSE(ids.empty()) << name << ": empty mask after " << text;
                    const int32_t pick = ids[rng() % ids.size()];
                    ASSERT_TRUE(m.accept_token(pick)) << name;
                    if (!m.is_terminated()) text += v.tokens[size_t(pick)];
                }
                ASSERT_TRUE(m.is_terminated()) << name << ": no EOS within " << budget << " tokens: " << text;
                ++ended;
                narrowed += closed;
                expect_valid(name + " (budget " + std::to_string(budget) + ")", text, schema);
            }
        }
    }
    EXPECT_GT(narrowed, ended / 4);  // the budget is exercised, not only natural ends
    std::printf(
        "budget walks: %d ended with EOS within their budget (%d of them narrowed by it); %d budgets over %d "
        "skipped\n",
        ended, narrowed, skipped, max_budget);
}

TEST(GrammarSchemaCorpus, RandomWalksEndWithinTheBudgetOnSmallVocabulary) {
    budget_walks(std::make_shared<const VocabIndex>(testing::stories_vocab()), full_or_sanitized(2, 1), 120);
}

TEST(GrammarSchemaCorpus, RandomWalksEndWithinTheBudgetOnLlama3Vocabulary) {
    budget_walks(std::make_shared<const VocabIndex>(testing::llama3_vocab()), 1, 120);
}

}  // namespace
}  // namespace peregrine::grammar
