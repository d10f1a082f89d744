// Tokenizer pieces on small hand-made vocabularies and on the embedded stories260K: UTF-8
// handling, regex splitting, added tokens, post-processing, the streaming detokenizer, the
// stop-string matcher and load errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "support/gguf_writer.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace peregrine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const Tokenizer& stories() {
    static const Tokenizer t = Tokenizer::load(std::string(PG_MODELS_DIR) + "/stories260K");
    return t;
}

class TempDir {
  public:
    TempDir() {
        path_ = fs::temp_directory_path() / ("peregrine-tok-" + std::to_string(::getpid()) + "-" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() { fs::remove_all(path_); }
    std::string write(const std::string& name, const std::string& content) const {
        const fs::path p = path_ / name;
        std::ofstream(p, std::ios::binary) << content;
        return p.string();
    }
    const fs::path& path() const { return path_; }

  private:
    fs::path path_;
};

// A byte-level BPE over the 256 byte symbols with a few merges, GPT-2 style.
json tiny_byte_level() {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[utf8::byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
    int next = 256;
    json merges = json::array();
    auto merge = [&](const std::string& a, const std::string& b) {
        merges.push_back(a + " " + b);
        if (!vocab.contains(a + b)) vocab[a + b] = next++;
    };
    merge("h", "e");         // 256 he
    merge("l", "l");         // 257 ll
    merge("he", "ll");       // 258 hell
    merge("hell", "o");      // 259 hello
    merge("\xc4\xa0", "w");  // 260 Ġw
    return json{
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"added_tokens", json::array({
                             {{"id", 300}, {"content", "<|s|>"}, {"special", true}},
                             {{"id", 301}, {"content", "<tool>"}, {"special", false}},
                             {{"id", 302}, {"content", "<|e|>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}},
                         })},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single", json::array({{{"SpecialToken", {{"id", "<|s|>"}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
          {"special_tokens", {{"<|s|>", {{"id", "<|s|>"}, {"ids", {300}}, {"tokens", {"<|s|>"}}}}}}}}};
}

TEST(TokenizerUtf8, NextCharClassifiesSequences) {
    size_t len;
    EXPECT_EQ(utf8::next_char("a", 1, &len), utf8::Utf8Status::Valid);
    EXPECT_EQ(len, 1u);
    EXPECT_EQ(utf8::next_char("\xc3\xa9", 2, &len), utf8::Utf8Status::Valid);
    EXPECT_EQ(len, 2u);
    EXPECT_EQ(utf8::next_char("\xf0\x9f\xa6\x99", 4, &len), utf8::Utf8Status::Valid);
    EXPECT_EQ(utf8::next_char("\xf0\x9f", 2, &len), utf8::Utf8Status::Incomplete);
    EXPECT_EQ(utf8::next_char("\xc0\xaf", 2, &len), utf8::Utf8Status::Invalid);  // overlong
    EXPECT_EQ(len, 1u);
    EXPECT_EQ(utf8::next_char("\xed\xa0\x80", 3, &len), utf8::Utf8Status::Invalid);  // surrogate
    EXPECT_EQ(utf8::next_char("\xe2\x82"
                              "A",
                              3, &len),
              utf8::Utf8Status::Invalid);
    EXPECT_EQ(len, 2u);  // the maximal subpart
}

TEST(TokenizerUtf8, SanitizeAndTakeComplete) {
    EXPECT_EQ(utf8::sanitize("a\xff"
                             "b"),
              "a\xEF\xBF\xBD"
              "b");
    EXPECT_EQ(utf8::sanitize("\xe2\x82"
                             "A"),
              "\xEF\xBF\xBD"
              "A");
    EXPECT_EQ(utf8::sanitize("x\xf0\x9f"), "x\xEF\xBF\xBD");
    std::string pending = "ab\xf0\x9f\xa6", out;
    utf8::take_complete(pending, out);
    EXPECT_EQ(out, "ab");
    EXPECT_EQ(pending, "\xf0\x9f\xa6");
    pending += "\x99";
    utf8::take_complete(pending, out);
    EXPECT_EQ(out, "ab\xf0\x9f\xa6\x99");
    EXPECT_TRUE(pending.empty());
}

TEST(TokenizerUtf8, ByteLevelAlphabetRoundTrips) {
    std::string all;
    for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
    const std::string enc = utf8::byte_level_encode(all);
    EXPECT_TRUE(utf8::is_valid(enc));
    EXPECT_EQ(utf8::byte_level_encode(" "), "\xc4\xa0");  // Ġ
    std::string dec;
    ASSERT_TRUE(utf8::byte_level_decode(enc, dec));
    EXPECT_EQ(dec, all);
    EXPECT_FALSE(utf8::byte_level_decode("日", dec));
}

TEST(TokenizerUtf8, NormalizesToNfc) {
    EXPECT_EQ(utf8::normalize("e\xcc\x81", utf8::NormalForm::NFC), "\xc3\xa9");  // e + combining acute → é
    EXPECT_EQ(utf8::normalize("plain", utf8::NormalForm::NFC), "plain");
}

TEST(TokenizerSplit, BehaviorsAndSequences) {
    auto split = [](std::vector<SplitRule> rules, const std::string& s) {
        RegexSplitter sp(std::move(rules), "test");
        std::vector<std::string_view> v;
        sp.split(s, v);
        return std::vector<std::string>(v.begin(), v.end());
    };
    using V = std::vector<std::string>;
    EXPECT_EQ(split({{"-", SplitBehavior::Isolated}}, "a-b--c"), (V{"a", "-", "b", "-", "-", "c"}));
    EXPECT_EQ(split({{"-", SplitBehavior::Removed}}, "a-b--c"), (V{"a", "b", "c"}));
    EXPECT_EQ(split({{"-", SplitBehavior::MergedWithPrevious}}, "a-b--c"), (V{"a-", "b-", "-", "c"}));
    EXPECT_EQ(split({{"-", SplitBehavior::MergedWithNext}}, "a-b--c"), (V{"a", "-b", "-", "-c"}));
    EXPECT_EQ(split({{"-", SplitBehavior::Contiguous}}, "a-b--c"), (V{"a", "-", "b", "--", "c"}));
    EXPECT_EQ(split({{kGpt2SplitRegex, SplitBehavior::Isolated}}, "Hello world's  3 🦙!"),
              (V{"Hello", " world", "'s", " ", " 3", " 🦙!"}));
    // Rule 2 cuts what rule 1 produced.
    EXPECT_EQ(split({{R"(\p{N})", SplitBehavior::Isolated}, {R"( ?\p{L}+)", SplitBehavior::Isolated}}, "ab12 cd"),
              (V{"ab", "1", "2", " cd"}));
    // A pattern that matches the empty string delimits nothing.
    EXPECT_EQ(split({{"x*", SplitBehavior::Isolated}}, "axb"), (V{"a", "x", "b"}));
    EXPECT_THROW(RegexSplitter({{"(", SplitBehavior::Isolated}}, "where.json"), Error);
}

TEST(TokenizerSplit, GgufFamiliesKnown) {
    bool ignore = false;
    for (const char* pre : {"llama-bpe", "qwen2", "gpt-2", "deepseek-coder", "deepseek-llm", "deepseek-v3", "starcoder",
                            "mpt", "falcon", "default", "tekken", "bloom"}) {
        const auto rules = gguf_pre_tokenizer_rules(pre, &ignore);
        EXPECT_NO_THROW(RegexSplitter(rules, pre)) << pre;
    }
    gguf_pre_tokenizer_rules("llama-bpe", &ignore);
    EXPECT_TRUE(ignore);
    EXPECT_THROW(gguf_pre_tokenizer_rules("no-such-family", &ignore), Error);
}

TEST(TokenizerJson, ByteLevelMergesAddedTokensAndTemplate) {
    TempDir dir;
    const Tokenizer tok = Tokenizer::load(dir.write("tokenizer.json", tiny_byte_level().dump()));
    EXPECT_EQ(tok.kind(), TokenizerKind::ByteLevelBpe);
    // "hello" merges all the way; " world" keeps "Ġw" + bytes.
    EXPECT_EQ(tok.encode("hello world", false), (std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd'}));
    // The template adds <|s|>; special text is plain text unless parse_special.
    EXPECT_EQ(tok.encode("he", true), (std::vector<int32_t>{300, 256}));
    const auto plain = tok.encode("<|s|>", false, false);
    EXPECT_EQ(plain.size(), 5u);
    EXPECT_EQ(tok.encode("<|s|>he", false, true), (std::vector<int32_t>{300, 256}));
    // Non-special added tokens are always recognized.
    EXPECT_EQ(tok.encode("he<tool>he", false, false), (std::vector<int32_t>{256, 301, 256}));
    // lstrip/rstrip swallow the spaces around <|e|>.
    EXPECT_EQ(tok.encode("he  <|e|>  he", false, true), (std::vector<int32_t>{256, 302, 256}));
    EXPECT_EQ(tok.decode(tok.encode("hello world <tool>!", true, true)), "hello world <tool>!");
    EXPECT_EQ(tok.decode({300, 259}, false), "<|s|>hello");
    EXPECT_THROW(tok.decode({999}), Error);
}

TEST(TokenizerJson, ConfigOverridesTemplate) {
    TempDir dir;
    const std::string path = dir.write("tokenizer.json", tiny_byte_level().dump());
    dir.write("tokenizer_config.json",
              json{{"add_bos_token", false}, {"add_eos_token", true}, {"eos_token", {{"content", "<|e|>"}}}}.dump());
    const Tokenizer tok = Tokenizer::load(dir.path().string());  // the folder
    EXPECT_EQ(tok.eos_id(), 302);
    EXPECT_EQ(tok.encode("he", true), (std::vector<int32_t>{256, 302}));
}

TEST(TokenizerJson, InvalidUtf8IsReadAsReplacementCharacters) {
    TempDir dir;
    const Tokenizer tok = Tokenizer::load(dir.write("tokenizer.json", tiny_byte_level().dump()));
    const auto ids = tok.encode("he\xff\xfe", false);
    EXPECT_EQ(tok.decode(ids), "he\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerJson, MalformedFilesGiveClearErrors) {
    TempDir dir;
    auto error_of = [](const std::string& path) -> std::string {
        try {
            Tokenizer::load(path);
        } catch (const Error& e) {
            return e.what();
        }
        return "no error";
    };
    const std::string bad_json = dir.write("bad.json", "{\"model\": ");
    EXPECT_NE(error_of(bad_json).find("bad.json: invalid JSON"), std::string::npos) << error_of(bad_json);
    const std::string no_model = dir.write("nomodel.json", "{}");
    EXPECT_NE(error_of(no_model).find("missing object 'model'"), std::string::npos);
    json j = tiny_byte_level();
    j["model"]["type"] = "WordPiece";
    const std::string wp = dir.write("wp.json", j.dump());
    EXPECT_NE(error_of(wp).find("'WordPiece' is not supported"), std::string::npos);
    j = tiny_byte_level();
    j["model"]["merges"].push_back("nope zzz");
    const std::string bad_merge = dir.write("merge.json", j.dump());
    EXPECT_NE(error_of(bad_merge).find("outside the vocabulary"), std::string::npos) << error_of(bad_merge);
    j = tiny_byte_level();
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    const std::string bad_regex = dir.write("regex.json", j.dump());
    EXPECT_NE(error_of(bad_regex).find("does not compile"), std::string::npos) << error_of(bad_regex);
    EXPECT_NE(error_of((dir.path() / "missing.json").string()).find("no such file"), std::string::npos);
    EXPECT_NE(error_of(dir.path().string()).find("no tokenizer.json"), std::string::npos);
    // GGUF files: no vocabulary, an unsupported model, arrays that disagree, an unknown family.
    auto gguf = [&](const std::string& name, const std::function<void(testing::GgufBuilder&)>& fill) {
        testing::GgufBuilder b;
        b.kv_str("general.architecture", "llama");
        fill(b);
        const std::string path = (dir.path() / name).string();
        b.write(path);
        return path;
    };
    const std::string novocab = gguf("novocab.gguf", [](auto&) {});
    EXPECT_NE(error_of(novocab).find("novocab.gguf: no vocabulary"), std::string::npos) << error_of(novocab);
    const std::string bert = gguf("bert.gguf", [](auto& b) {
        b.kv_str("tokenizer.ggml.model", "bert");
        b.kv_str_array("tokenizer.ggml.tokens", {"a"});
    });
    EXPECT_NE(error_of(bert).find("'bert' is not supported"), std::string::npos) << error_of(bert);
    const std::string types = gguf("types.gguf", [](auto& b) {
        b.kv_str("tokenizer.ggml.model", "llama");
        b.kv_str_array("tokenizer.ggml.tokens", {"a", "b"});
        b.kv_i32_array("tokenizer.ggml.token_type", {1});
    });
    EXPECT_NE(error_of(types).find("'tokenizer.ggml.token_type' has 1 entries for 2 tokens"), std::string::npos)
        << error_of(types);
    const std::string family = gguf("family.gguf", [](auto& b) {
        b.kv_str("tokenizer.ggml.model", "gpt2");
        b.kv_str("tokenizer.ggml.pre", "martian");
        b.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
        b.kv_str_array("tokenizer.ggml.merges", {"a b"});
    });
    EXPECT_NE(error_of(family).find("unknown pre-tokenizer 'martian'"), std::string::npos) << error_of(family);
}

TEST(TokenizerStories, ByteFallbackStreamsWholeCharacters) {
    const Tokenizer& tok = stories();
    const std::string text = "Hi 日本, café!";
    const auto ids = tok.encode(text, false);
    int byte_tokens = 0;
    for (int32_t id : ids) byte_tokens += tok.type(id) == TokenType::Byte;
    EXPECT_GE(byte_tokens, 6);  // 日 and 本 are not in the 512-token vocabulary
    EXPECT_EQ(tok.decode(ids), text);
    IncrementalDetokenizer detok(tok);
    std::string out;
    for (int32_t id : ids) {
        const std::string d = detok.push(id);
        EXPECT_TRUE(utf8::is_valid(d));
        out += d;
        EXPECT_LT(detok.held_bytes(), 4u);
    }
    out += detok.finish();
    EXPECT_EQ(out, text);
}

TEST(TokenizerStories, LeadingSpaceRule) {
    const Tokenizer& tok = stories();
    const auto ids = tok.encode("Once upon a time");  // 1 403 407 261 378
    IncrementalDetokenizer d(tok);
    std::string out;
    for (int32_t id : ids) out += d.push(id);
    EXPECT_EQ(out, "Once upon a time");  // "▁Once" shows without its space at the start
    // After a primed prompt the first generated token keeps its space.
    IncrementalDetokenizer cont(tok);
    cont.prime(ids);
    EXPECT_EQ(cont.push(ids[2]), " upon");
    // A cut character at the end comes out as U+FFFD, never as a raw byte.
    IncrementalDetokenizer cut(tok);
    const int32_t e6 = tok.token_to_id("<0xE6>");
    ASSERT_GE(e6, 0);
    EXPECT_EQ(cut.push(e6), "");
    EXPECT_EQ(cut.finish(), "\xEF\xBF\xBD");
    EXPECT_THROW(cut.push(100000), Error);
}

TEST(TokenizerStories, SharedAcrossThreads) {
    const Tokenizer& tok = stories();
    const std::string text = "Once upon a time, there was a little girl named Lily. 日本 café\n\n";
    const auto expected = tok.encode(text);
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] {
            for (int i = 0; i < 200; ++i)
                if (tok.encode(text) != expected || tok.decode(expected) != text) ++mismatches;
        });
    for (auto& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerStop, HoldsBackOnlyPossibleStarts) {
    StopMatcher m({"</s>", "STOP"});
    auto r = m.push("Hello <");
    EXPECT_EQ(r.emit, "Hello ");
    EXPECT_FALSE(r.matched);
    r = m.push("b>");  // "<b>" cannot start a stop string any more
    EXPECT_EQ(r.emit, "<b>");
    r = m.push(" ST");
    EXPECT_EQ(r.emit, " ");
    r = m.push("OP and more");
    EXPECT_TRUE(r.matched);
    EXPECT_EQ(r.stop_index, 1);
    EXPECT_EQ(r.emit, "");
    EXPECT_EQ(m.push("x").emit, "");  // nothing after a match
    EXPECT_EQ(m.flush(), "");
}

TEST(TokenizerStop, FlushReturnsHeldTextWithoutMatch) {
    StopMatcher m({"\n\nUser:"});
    EXPECT_EQ(m.push("bye\n").emit, "bye");
    EXPECT_EQ(m.push("\nUs").emit, "");
    EXPECT_EQ(m.flush(), "\n\nUs");
    StopMatcher none({});
    EXPECT_EQ(none.push("abc").emit, "abc");
}

TEST(TokenizerStop, NeverLeaksAcrossRandomChunkings) {
    std::mt19937 rng(7);
    const std::vector<std::string> stops = {"ab", "abc", "bca", "é!"};
    const std::string alphabet[] = {"a", "b", "c", "x", "é", "!"};
    for (int trial = 0; trial < 2000; ++trial) {
        std::string text;
        const int len = 1 + static_cast<int>(rng() % 12);
        for (int i = 0; i < len; ++i) text += alphabet[rng() % 6];
        std::vector<size_t> chunks;
        for (size_t i = 0; i < text.size(); i += chunks.back()) chunks.push_back(1 + rng() % 4);
        // The stream ends at the first push that completes a stop string; what shows is the text
        // before the earliest stop string in the text seen by then.
        size_t first = std::string::npos, seen = 0;
        for (size_t n : chunks) {
            seen += n;
            for (const auto& s : stops) first = std::min(first, text.substr(0, seen).find(s));
            if (first != std::string::npos) break;
        }
        StopMatcher m(stops);
        std::string shown;
        bool matched = false;
        size_t c = 0;
        for (size_t i = 0; i < text.size() && !matched;) {
            const size_t n = chunks[c++];
            const auto r = m.push(std::string_view(text).substr(i, n));
            shown += r.emit;
            matched = r.matched;
            i += n;
            // Never more than the text before the first stop string.
            ASSERT_LE(shown.size(), first == std::string::npos ? text.size() : first) << text;
        }
        if (!matched) shown += m.flush();
        EXPECT_EQ(matched, first != std::string::npos) << text;
        EXPECT_EQ(shown, text.substr(0, first)) << text;
    }
}

}  // namespace
}  // namespace peregrine
