// The schema corpus (tests/data/json-schemas/corpus.json, 100+ schemas: every supported keyword
// and real-world-shaped tool definitions): each compiles, and random walks through the token
// masks always end in JSON that parses and satisfies the schema, on the 512-token SentencePiece
// vocabulary of the embedded model (byte tokens: any text is reachable) and on Llama 3's.
#include <fstream>

#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "grammar_test_util.h"
#include "hf_vocab.h"

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
            std::string text = testing::random_walk(tg, rng, free_steps);
            Json value;
            try {
                value = Json::parse(text);
            } catch (const std::exception& e) {
                ADD_FAILURE() << name << ": output does not parse: " << text << "\n" << e.what();
                continue;
            }
            EXPECT_EQ(testing::check_schema(value, schema, schema), "") << name << ": " << text;
        }
    }
}

TEST(GrammarSchemaCorpus, RandomWalksOnSmallVocabulary) {
    walk_corpus(std::make_shared<const VocabIndex>(testing::stories_vocab()), 4, 40);
}

TEST(GrammarSchemaCorpus, RandomWalksOnLlama3Vocabulary) {
    walk_corpus(std::make_shared<const VocabIndex>(testing::llama3_vocab()), 1, 15);
}

}  // namespace
}  // namespace peregrine::grammar
