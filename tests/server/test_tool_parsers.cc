// Tool calls in the model's own format (tool_choice "auto"): each format, several calls,
// malformed ones kept as text, the format chosen from real chat templates, and the streaming
// parser fed in two pieces split at every byte (and byte by byte) agreeing with the whole parse.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/openai/completion_request.h"
#include "server/openai/tool_parsers.h"
#include "template/chat_template.h"

namespace peregrine::server {
namespace {

using F = ToolCallFormat;

std::string calls_text(const std::vector<ParsedToolCall>& calls) {
    std::string s;
    for (const ParsedToolCall& c : calls) s += c.name + ":" + c.arguments + ";";
    return s;
}

// Feeds `text` cut at `cuts`, then finish(): the content and calls it streamed, joined.
ToolCallDelta streamed(F f, const std::string& text, const std::vector<size_t>& cuts,
                       std::vector<std::string> names = {}, bool one_call = false) {
    ToolCallParser p(f, std::move(names), one_call);
    ToolCallDelta all;
    size_t from = 0;
    auto take = [&](ToolCallDelta d) {
        all.content += d.content;
        for (ParsedToolCall& c : d.calls) all.calls.push_back(std::move(c));
    };
    for (size_t cut : cuts) {
        take(p.feed(std::string_view(text).substr(from, cut - from)));
        from = cut;
    }
    take(p.feed(std::string_view(text).substr(from)));
    take(p.finish());
    return all;
}

// Every two-piece split and the byte-by-byte feed give the whole parse's content and calls.
void expect_stream_agrees(F f, const std::string& text, std::vector<std::string> names = {}, bool one_call = false) {
    const ToolCallDelta whole = parse_tool_calls(f, text, names, one_call);
    for (size_t cut = 0; cut <= text.size(); ++cut) {
        const ToolCallDelta s = streamed(f, text, {cut}, names, one_call);
        EXPECT_EQ(s.content, whole.content) << "cut at " << cut << " of " << text;
        EXPECT_EQ(calls_text(s.calls), calls_text(whole.calls)) << "cut at " << cut << " of " << text;
    }
    std::vector<size_t> every;
    for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
    const ToolCallDelta bytes = streamed(f, text, every, names, one_call);
    EXPECT_EQ(bytes.content, whole.content) << text;
    EXPECT_EQ(calls_text(bytes.calls), calls_text(whole.calls)) << text;
}

struct Case {
    F format;
    std::string text;
    std::string content;
    std::string calls;  // calls_text
};

const std::vector<Case>& cases() {
    static const std::vector<Case> all = {
        // hermes
        {F::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
         "get_weather:{\"city\":\"Paris\"};"},
        {F::Hermes,
         "Let me look.\n<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>\n<tool_call>\n{\"name\": "
         "\"b\", \"arguments\": {}}\n</tool_call>",
         "Let me look.", "a:{\"x\":1};b:{};"},
        {F::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 2}\"}</tool_call>", "", "a:{\"x\":2};"},
        {F::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"s\": \"</tool\"}}", "", "a:{\"s\":\"</tool\"};"},
        // Committed once the name and the arguments' start are read: a call left open is a call.
        {F::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}</tool_call> tail", " tail", "a:{};"},
        {F::Hermes, "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", ""},
        {F::Hermes, "plain text < with <tool angle", "plain text < with <tool angle", ""},
        {F::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": []}</tool_call>",
         "<tool_call>{\"name\": \"a\", \"arguments\": []}</tool_call>", ""},
        {F::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> and more", " and more", "a:{};"},
        {F::Hermes, "  answer  ", "  answer  ", ""},
        // llama3_json
        {F::Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "",
         "get_weather:{\"city\":\"Paris\"};"},
        {F::Llama3Json,
         "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": "
         "[1, 2]}}",
         "", "a:{};b:{\"k\":[1,2]};"},
        {F::Llama3Json, "Sure.<|python_tag|>{\"name\": \"a\", \"arguments\": {}};{\"name\": \"b\", \"parameters\": {}}",
         "Sure.", "a:{};b:{};"},
        {F::Llama3Json, "{\"answer\": 42}", "{\"answer\": 42}", ""},
        {F::Llama3Json, "The object {\"name\": \"a\", \"parameters\": {}} is JSON",
         "The object {\"name\": \"a\", \"parameters\": {}} is JSON", ""},
        {F::Llama3Json, "{\"name\": \"a\", \"parameters\": {}}; oops", "; oops", "a:{};"},
        {F::Llama3Json, "{\"name\": \"a\", \"parameters\": {", "", "a:{;"},
        {F::Llama3Json, "{\"name\": \"a\", \"param", "{\"name\": \"a\", \"param", ""},
        // mistral
        {F::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", "",
         "get_weather:{\"city\":\"Paris\"};"},
        {F::Mistral,
         "Checking. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"q\": "
         "\"x]\"}}]",
         "Checking.", "a:{};b:{\"q\":\"x]\"};"},
        {F::Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]b[ARGS]{}", "",
         "get_weather:{\"city\":\"Paris\"};b:{};"},
        {F::Mistral, "[{\"name\": \"a\", \"arguments\": {}}]", "", "a:{};"},
        {F::Mistral, "[1, 2, 3]", "[1, 2, 3]", ""},
        {F::Mistral, "[TOOL_CALLS]bad name[ARGS]{}", "[TOOL_CALLS]bad name[ARGS]{}", ""},
        {F::Mistral, "[TOOL_CALLS]f[ARGS]{\"a\": ", "", "f:{\"a\":;"},
        {F::Mistral, "[TOOL_CALLS]f[AR", "[TOOL_CALLS]f[AR", ""},
        // After a call went out, a bad one is dropped with the rest of its block.
        {F::Mistral, "[TOOL_CALLS][{\"name\": \"a\"}, {\"nam\": \"b\"}] ok", " ok", "a:{};"},
        {F::Mistral, "[TOOL_CALLS][{\"nam\": \"b\"}, {\"name\": \"a\"}]",
         "[TOOL_CALLS][{\"nam\": \"b\"}, {\"name\": \"a\"}]", ""},
        // none: everything is text
        {F::None, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>",
         "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>", ""},
    };
    return all;
}

TEST(ToolParsers, EachFormatWholeAndStreamedAtEveryByte) {
    for (const Case& c : cases()) {
        SCOPED_TRACE(std::string(tool_call_format_name(c.format)) + ": " + c.text);
        const ToolCallDelta d = parse_tool_calls(c.format, c.text);
        EXPECT_EQ(d.content, c.content);
        EXPECT_EQ(calls_text(d.calls), c.calls);
        expect_stream_agrees(c.format, c.text);
    }
}

TEST(ToolParsers, CallsToUnknownToolsStayText) {
    const std::string text = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
    EXPECT_EQ(parse_tool_calls(F::Hermes, text, {"get_weather"}).content, text);
    EXPECT_EQ(calls_text(parse_tool_calls(F::Hermes, text, {"rm_rf"}).calls), "rm_rf:{};");
    expect_stream_agrees(F::Hermes, text, {"get_weather"});
}

// parallel_tool_calls false: the first call only; what follows it (more calls included) is text,
// and a block of several calls is text as a whole.
TEST(ToolParsers, OneCallWithoutParallelToolCalls) {
    const std::string a = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
    const std::string b = "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    ToolCallDelta d = parse_tool_calls(F::Hermes, a + "\n" + b, {}, /*one_call=*/true);
    EXPECT_EQ(calls_text(d.calls), "a:{};");
    EXPECT_EQ(d.content, "\n" + b);
    expect_stream_agrees(F::Hermes, a + "\n" + b, {}, true);
    const std::string two = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {}}]";
    d = parse_tool_calls(F::Mistral, two, {}, true);
    EXPECT_TRUE(d.calls.empty());
    EXPECT_EQ(d.content, two);
    expect_stream_agrees(F::Mistral, two, {}, true);
    const std::string llama = "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}";
    d = parse_tool_calls(F::Llama3Json, llama, {}, true);
    EXPECT_EQ(calls_text(d.calls), "a:{};");
    EXPECT_EQ(d.content, "; {\"name\": \"b\", \"parameters\": {}}");
    expect_stream_agrees(F::Llama3Json, llama, {}, true);
}

// Content goes out as soon as it cannot begin a marker; only a possible marker start is held.
TEST(ToolParsers, HoldsBackOnlyAPossibleMarker) {
    ToolCallParser p(F::Hermes);
    EXPECT_EQ(p.feed("Hello there").content, "Hello there");
    EXPECT_EQ(p.feed(" <tool").content, "");  // " " waits for text, "<tool" may be a marker
    EXPECT_EQ(p.feed("box> ok").content, " <toolbox> ok");
    ToolCallDelta d = p.feed("<tool_call>{\"name\": \"f\", \"arguments\": {}");
    EXPECT_EQ(d.content, "");
    EXPECT_TRUE(d.calls.empty());  // its pieces went out; the call is not complete
    EXPECT_EQ(d.pieces.size(), 1u);
    d = p.feed("}");
    ASSERT_EQ(d.calls.size(), 1u);  // out as soon as it is complete
    EXPECT_FALSE(p.called());       // the closing tag may still come
    d = p.feed("</tool_call>");
    EXPECT_TRUE(d.calls.empty());
    EXPECT_TRUE(p.called());
    EXPECT_EQ(p.finish().content, "");
}

TEST(ToolParsers, FormatNamesAndDetectionFromRealTemplates) {
    EXPECT_EQ(tool_call_format_named("hermes"), F::Hermes);
    EXPECT_EQ(tool_call_format_named("llama3_json"), F::Llama3Json);
    EXPECT_EQ(tool_call_format_named("mistral"), F::Mistral);
    EXPECT_EQ(tool_call_format_named("none"), F::None);
    EXPECT_FALSE(tool_call_format_named("auto"));
    const std::filesystem::path dir = std::filesystem::path(PG_TEST_DATA_DIR) / "chat-templates" / "templates";
    auto detect = [&](const char* file) {
        std::ifstream in(dir / file);
        std::stringstream ss;
        ss << in.rdbuf();
        EXPECT_FALSE(ss.str().empty()) << file;
        return detect_tool_call_format(ss.str());
    };
    EXPECT_EQ(detect("Qwen-Qwen2.5-7B-Instruct.jinja"), F::Hermes);
    EXPECT_EQ(detect("Qwen-Qwen3-0.6B.jinja"), F::Hermes);
    EXPECT_EQ(detect("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"), F::Hermes);
    EXPECT_EQ(detect("meta-llama-Llama-3.1-8B-Instruct.jinja"), F::Llama3Json);
    EXPECT_EQ(detect("meta-llama-Llama-3.2-3B-Instruct.jinja"), F::Llama3Json);
    EXPECT_EQ(detect("unsloth-mistral-Devstral-Small-2507.jinja"), F::Mistral);
    EXPECT_EQ(detect_tool_call_format("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"), F::None);
}

// A tool round trip (assistant tool_calls with their arguments as OpenAI's JSON string, then
// the tool's answer) renders through a real template: arguments become objects for it.
TEST(ToolParsers, ToolMessagesRenderThroughTheTemplate) {
    const Json messages = Json::parse(R"([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}])");
    const Json normalized = normalize_messages(messages);
    EXPECT_TRUE(normalized[1]["tool_calls"][0]["function"]["arguments"].is_object());
    const ChatTemplate t = ChatTemplate::from_file(std::string(PG_TEST_DATA_DIR) +
                                                   "/chat-templates/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    ChatInputs in;
    in.messages = nlohmann::ordered_json::parse(normalized.dump());
    in.tools = nlohmann::ordered_json::parse(
        R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");
    in.add_generation_prompt = true;
    const std::string prompt = t.render(in);
    EXPECT_NE(prompt.find(R"({"name": "get_weather", "arguments": {"city": "Paris"}})"), std::string::npos) << prompt;
    EXPECT_NE(prompt.find("<tool_response>\n18 C, sunny\n</tool_response>"), std::string::npos) << prompt;
}

}  // namespace
}  // namespace peregrine::server
