// vLLM's --chat-template (a file or the template itself) and the content format it implies.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "template/chat_template.h"

namespace peregrine {
namespace {

nlohmann::ordered_json user(const nlohmann::ordered_json& content) {
    return nlohmann::ordered_json::array({{{"role", "user"}, {"content", content}}});
}

TEST(ChatTemplateFlag, InlineSourceGetsTheGivenTokens) {
    const ChatTemplate t =
        ChatTemplate::from_flag("{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}", "<s>", "</s>");
    ChatInputs in;
    in.messages = user("hi");
    EXPECT_EQ(t.render(in), "<s>hi</s>");
    EXPECT_EQ(t.content_format(), "string");
}

TEST(ChatTemplateFlag, FileIsRead) {
    const auto path = std::filesystem::temp_directory_path() / "pg_flag_template.jinja";
    std::ofstream(path) << "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}";
    const ChatTemplate t = ChatTemplate::from_flag(path.string(), "", "");
    EXPECT_EQ(t.content_format(), "openai");
    ChatInputs in;
    in.messages =
        user(nlohmann::ordered_json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}));
    EXPECT_EQ(t.render(in), "ab");
    std::filesystem::remove(path);
}

TEST(ChatTemplateFlag, NeitherFileNorTemplate) {
    try {
        ChatTemplate::from_flag("/nonexistent/template.jinja", "", "");
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no such file, and not a template"), std::string::npos) << e.what();
    }
}

TEST(ChatTemplateFlag, ContentFormatDetection) {
    auto format = [](const std::string& src) { return ChatTemplate(src, "t").content_format(); };
    EXPECT_EQ(format("{%- for item in message.content -%}{{ item.text }}{%- endfor %}"), "openai");
    EXPECT_EQ(format("{% for c in msg['content'] | selectattr('type', 'equalto', 'text') %}{% endfor %}"), "openai");
    EXPECT_EQ(format("{% for message in messages %}{{ message['content'] }}{% endfor %}"), "string");
}

}  // namespace
}  // namespace peregrine
