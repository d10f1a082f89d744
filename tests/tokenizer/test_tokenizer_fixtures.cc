// The tokenizer against ids produced by llama.cpp (the ggml-vocab GGUFs) and by Hugging Face
// tokenizers (llama3/, qwen3/): every case exact, and decode(encode(text)) == text.
#include <gtest/gtest.h>

#include <algorithm>

#include "support/tokenizer_test_util.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peregrine {
namespace {

using testing::cached_tokenizer;
using testing::tokenizer_data_dir;

struct FixtureSet {
    const char* name;
    const char* tokenizer;  // relative to the fixture folder
    const char* cases;      // .inp/.out without the extension
    TokenizerKind kind;
};

const FixtureSet kSets[] = {
    {"gpt2", "ggml-vocab-gpt-2.gguf", "ggml-vocab-gpt-2.gguf", TokenizerKind::ByteLevelBpe},
    {"llama_spm", "ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-spm.gguf", TokenizerKind::SentencePieceBpe},
    {"phi3", "ggml-vocab-phi-3.gguf", "ggml-vocab-phi-3.gguf", TokenizerKind::SentencePieceBpe},
    {"deepseek_coder", "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-deepseek-coder.gguf", TokenizerKind::ByteLevelBpe},
    {"mpt", "ggml-vocab-mpt.gguf", "ggml-vocab-mpt.gguf", TokenizerKind::ByteLevelBpe},
    {"starcoder", "ggml-vocab-starcoder.gguf", "ggml-vocab-starcoder.gguf", TokenizerKind::ByteLevelBpe},
    {"llama3", "llama3/tokenizer.json", "llama3/cases", TokenizerKind::ByteLevelBpe},
    {"qwen3", "qwen3/tokenizer.json", "qwen3/cases", TokenizerKind::ByteLevelBpe},
};

void PrintTo(const FixtureSet& f, std::ostream* os) {
    *os << f.tokenizer;
}

class TokenizerFixture : public ::testing::TestWithParam<FixtureSet> {};

std::string ids_str(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += std::to_string(id) + " ";
    return s;
}

TEST_P(TokenizerFixture, EveryCaseExactAndRoundTrips) {
    const FixtureSet& f = GetParam();
    const std::string dir = tokenizer_data_dir() + "/";
    const Tokenizer& tok = cached_tokenizer(dir + f.tokenizer);
    EXPECT_EQ(tok.kind(), f.kind);
    const auto cases = testing::read_tokenizer_cases(dir + f.cases + ".inp", dir + f.cases + ".out");
    ASSERT_GE(cases.size(), 40u);
    int exact = 0, round_trips = 0;
    for (const auto& c : cases) {
        const std::vector<int32_t> ids = tok.encode(c.text, /*add_special_tokens=*/false, /*parse_special=*/false);
        if (ids == c.ids)
            ++exact;
        else
            ADD_FAILURE() << f.name << ": '" << c.text << "'\n  expected " << ids_str(c.ids) << "\n  got      "
                          << ids_str(ids);
        const std::string back = tok.decode(ids);
        if (back == c.text)
            ++round_trips;
        else
            ADD_FAILURE() << f.name << ": decode(encode('" << c.text << "')) = '" << back << "'";
        // The streaming detokenizer agrees with decode(), one token at a time.
        IncrementalDetokenizer detok(tok);
        std::string streamed;
        for (int32_t id : ids) streamed += detok.push(id);
        streamed += detok.finish();
        EXPECT_EQ(streamed, back) << f.name << ": '" << c.text << "'";
    }
    std::printf("[ %s ] %d/%zu cases exact, %d/%zu round-trip\n", f.name, exact, cases.size(), round_trips,
                cases.size());
}

INSTANTIATE_TEST_SUITE_P(TokenizerFixtures, TokenizerFixture, ::testing::ValuesIn(kSets),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(TokenizerGolden, Stories260KOnceUponATime) {
    const std::vector<int32_t> expected = {1, 403, 407, 261, 378};
    for (const std::string& path :
         {std::string(PG_MODELS_DIR) + "/stories260K", std::string(PG_TEST_DATA_DIR) + "/stories260K.gguf"}) {
        const Tokenizer& tok = cached_tokenizer(path);
        EXPECT_EQ(tok.encode("Once upon a time"), expected) << path;
        EXPECT_EQ(tok.decode(expected), "Once upon a time") << path;
        EXPECT_EQ(tok.bos_id(), 1) << path;
        EXPECT_EQ(tok.eos_id(), 2) << path;
        EXPECT_TRUE(tok.strips_leading_space()) << path;
    }
}

TEST(TokenizerGolden, Qwen3SpecialTokensParsedOnlyWhenAsked) {
    const Tokenizer& tok = cached_tokenizer(tokenizer_data_dir() + "/qwen3/tokenizer.json");
    const int32_t im_start = tok.token_to_id("<|im_start|>"), im_end = tok.token_to_id("<|im_end|>");
    ASSERT_EQ(im_start, 151644);
    ASSERT_EQ(im_end, 151645);
    EXPECT_TRUE(tok.prefix_ids().empty());  // add_bos_token: false
    EXPECT_EQ(tok.eos_id(), im_end);
    const std::string chat = "<|im_start|>user\nHi<|im_end|>\n";
    const auto parsed = tok.encode(chat, true, /*parse_special=*/true);
    ASSERT_GE(parsed.size(), 4u);
    EXPECT_EQ(parsed.front(), im_start);
    EXPECT_NE(std::find(parsed.begin(), parsed.end(), im_end), parsed.end());
    const auto raw = tok.encode(chat, false, /*parse_special=*/false);
    EXPECT_EQ(std::find(raw.begin(), raw.end(), im_start), raw.end());
    EXPECT_EQ(std::find(raw.begin(), raw.end(), im_end), raw.end());
    EXPECT_EQ(tok.decode(raw), chat);             // plain text, nothing skipped
    EXPECT_EQ(tok.decode(parsed), "user\nHi\n");  // specials skipped
    EXPECT_EQ(tok.decode(parsed, false), chat);   // and kept
}

TEST(TokenizerGolden, Llama3EmojiStreamsWhole) {
    const Tokenizer& tok = cached_tokenizer(tokenizer_data_dir() + "/llama3/tokenizer.json");
    const std::string text = " this is 🦙.cpp";
    const auto ids = tok.encode(text, false);
    IncrementalDetokenizer detok(tok);
    std::string out;
    for (int32_t id : ids) {
        const std::string d = detok.push(id);
        EXPECT_TRUE(utf8::is_valid(d)) << "a delta ends inside a character";
        out += d;
    }
    out += detok.finish();
    EXPECT_EQ(out, text);
    // The llama emoji (4 bytes) comes in three tokens: nothing shows until the last one.
    const auto emoji = tok.encode("🦙", false);
    ASSERT_GT(emoji.size(), 1u);
    IncrementalDetokenizer d2(tok);
    for (size_t i = 0; i + 1 < emoji.size(); ++i) EXPECT_EQ(d2.push(emoji[i]), "");
    EXPECT_EQ(d2.push(emoji.back()), "🦙");
}

}  // namespace
}  // namespace peregrine
