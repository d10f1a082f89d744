// Tool calls streamed as OpenAI streams them: each call's name first, then its arguments piece
// by piece. The answer is fed in random-sized pieces (as a model's tokens come); the content
// pieces must join into the content with no markup, each call's argument pieces must join into
// its final arguments exactly, arguments must go out before the call is complete, and a false
// start must come out as content with no call piece ever sent.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "server/openai/tool_call_stream.h"
#include "server/openai/tool_parsers.h"

namespace peregrine::server {
namespace {

using F = ToolCallFormat;

struct Streamed {
    std::string content;
    std::map<int, std::string> names;      // per call index: the name its first piece carried
    std::map<int, std::string> arguments;  // per call index: its argument pieces, joined
    std::map<int, int> pieces;             // per call index: how many argument pieces
    std::vector<ParsedToolCall> calls;     // as reported complete
    bool name_twice = false;               // a call's name came in a later piece too
    bool args_before_name = false;         // an argument piece before the call's first piece
};

// Feeds `text` in pieces of 1..max_piece bytes (seeded), then finish().
Streamed stream(F f, const std::string& text, unsigned seed, size_t max_piece, std::vector<std::string> names = {},
                bool one_call = false) {
    ToolCallParser p(f, std::move(names), one_call);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<size_t> len(1, max_piece);
    Streamed s;
    auto take = [&](const ToolCallDelta& d) {
        std::string content;
        for (const ToolCallPiece& piece : d.pieces) {
            if (piece.call < 0) {
                s.content += piece.text;
                content += piece.text;
                continue;
            }
            if (!piece.name.empty()) {
                if (s.names.count(piece.call)) s.name_twice = true;
                s.names[piece.call] = piece.name;
            } else if (!s.names.count(piece.call)) {
                s.args_before_name = true;
            }
            s.arguments[piece.call] += piece.text;
            if (!piece.text.empty()) ++s.pieces[piece.call];
        }
        EXPECT_EQ(content, d.content);  // the content pieces are the delta's content
        for (const ParsedToolCall& c : d.calls) s.calls.push_back(c);
    };
    for (size_t at = 0; at < text.size();) {
        const size_t n = std::min(len(rng), text.size() - at);
        take(p.feed(std::string_view(text).substr(at, n)));
        at += n;
    }
    take(p.finish());
    return s;
}

// Every way of cutting gives the whole parse; the argument pieces join into the calls.
void expect_streams(F f, const std::string& text, const std::string& content, const std::vector<ParsedToolCall>& calls,
                    std::vector<std::string> names = {}, bool one_call = false, bool in_pieces = true) {
    const ToolCallDelta whole = parse_tool_calls(f, text, names, one_call);
    EXPECT_EQ(whole.content, content);
    ASSERT_EQ(whole.calls.size(), calls.size());
    for (size_t k = 0; k < calls.size(); ++k) {
        EXPECT_EQ(whole.calls[k].name, calls[k].name);
        EXPECT_EQ(whole.calls[k].arguments, calls[k].arguments);
    }
    for (unsigned seed = 1; seed <= 40; ++seed) {
        const size_t max_piece = 1 + seed % 9;
        SCOPED_TRACE("seed " + std::to_string(seed) + ", pieces up to " + std::to_string(max_piece));
        const Streamed s = stream(f, text, seed, max_piece, names, one_call);
        EXPECT_EQ(s.content, content);
        EXPECT_FALSE(s.name_twice);
        EXPECT_FALSE(s.args_before_name);
        ASSERT_EQ(s.names.size(), calls.size());
        ASSERT_EQ(s.calls.size(), calls.size());
        for (size_t k = 0; k < calls.size(); ++k) {
            const int i = static_cast<int>(k);
            EXPECT_EQ(s.names.at(i), calls[k].name);
            EXPECT_EQ(s.arguments.at(i), calls[k].arguments);
            EXPECT_EQ(s.calls[k].arguments, calls[k].arguments);
            // A long call streams: many pieces when the text comes in small ones.
            if (in_pieces && calls[k].arguments.size() > 60 && max_piece <= 4) {
                EXPECT_GT(s.pieces.at(i), 5) << calls[k].name;
            }
        }
    }
}

const std::string kLongArgs =
    R"({"city": "Paris", "days": [1, 2, 3], "units": "metric", "note": "a \"quoted\" } ] , string",)"
    R"( "nested": {"deep": {"ok": true, "n": -1.5e3}}})";
const std::string kLongCompact =
    R"({"city":"Paris","days":[1,2,3],"units":"metric","note":"a \"quoted\" } ] , string",)"
    R"("nested":{"deep":{"ok":true,"n":-1.5e3}}})";

TEST(ToolCallStreaming, HermesCallsStreamTheirArguments) {
    const std::string text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + kLongArgs +
                             "}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
    expect_streams(F::Hermes, text, "Let me check.", {{"get_weather", kLongCompact}, {"b", "{}"}});
    // Arguments given as a string of JSON: they appear whole once the string closes.
    expect_streams(F::Hermes, R"(<tool_call>{"name": "a", "arguments": "{\"x\": [1, 2]}"}</tool_call>)", "",
                   {{"a", R"({"x":[1,2]})"}});
    // The name after the arguments: nothing goes out before the name, then all that came.
    expect_streams(F::Hermes, "<tool_call>{\"arguments\": " + kLongArgs + ", \"name\": \"late\"}</tool_call> ok", " ok",
                   {{"late", kLongCompact}}, {}, false, /*in_pieces=*/false);
}

TEST(ToolCallStreaming, HermesClosingTagInsideAnArgumentIsText) {
    // A call that writes the tag itself (say, code that emits tool calls): the tag inside the JSON
    // string is argument text, the tag after the object ends the block.
    const std::string args = R"j({"code": "print('</tool_call>')", "n": 1})j";
    expect_streams(F::Hermes, "<tool_call>\n{\"name\": \"run\", \"arguments\": " + args + "}\n</tool_call> done",
                   " done", {{"run", R"j({"code":"print('</tool_call>')","n":1})j"}});
    // Two such tags and an escaped quote before them; then a second call.
    const std::string tricky = R"({"a": "x\" </tool_call> y", "b": "</tool_call></tool_call>"})";
    expect_streams(F::Hermes,
                   "<tool_call>{\"name\": \"f\", \"arguments\": " + tricky +
                       "}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
                   "", {{"f", R"({"a":"x\" </tool_call> y","b":"</tool_call></tool_call>"})"}, {"g", "{}"}});
}

TEST(ToolCallStreaming, Llama3AndMistralCallsStreamTheirArguments) {
    expect_streams(
        F::Llama3Json,
        "{\"name\": \"get_weather\", \"parameters\": " + kLongArgs + "}; {\"name\": \"b\", \"parameters\": {}}", "",
        {{"get_weather", kLongCompact}, {"b", "{}"}});
    expect_streams(F::Llama3Json, "Sure.<|python_tag|>{\"name\": \"get_weather\", \"parameters\": " + kLongArgs + "}",
                   "Sure.", {{"get_weather", kLongCompact}});
    expect_streams(F::Mistral,
                   "Checking. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": " + kLongArgs +
                       "}, {\"name\": \"b\", \"arguments\": {\"q\": \"x]\"}}]",
                   "Checking.", {{"get_weather", kLongCompact}, {"b", R"({"q":"x]"})"}});
    expect_streams(F::Mistral, "[TOOL_CALLS]get_weather[ARGS]" + kLongArgs + "[TOOL_CALLS]b[ARGS]{}", "",
                   {{"get_weather", kLongCompact}, {"b", "{}"}});
}

// tool_choice required / named: the grammar's array, indices 0, 1, ...
TEST(ToolCallStreaming, ForcedArrayStreamsEachCall) {
    expect_streams(F::Forced,
                   "[{\"name\":\"get_weather\",\"arguments\":" + kLongCompact + "},{\"name\":\"b\",\"arguments\":{}}]",
                   "", {{"get_weather", kLongCompact}, {"b", "{}"}});
    // Cut short by max_tokens: what was written of the call stands; before any name: content.
    expect_streams(F::Forced, R"([{"name":"f","arguments":{"a":"xy)", "", {{"f", R"({"a":"xy)"}});
    expect_streams(F::Forced, R"([{"na)", R"([{"na)", {});
}

// Text that starts like a call and is not one: all of it content, and no call piece went out.
TEST(ToolCallStreaming, FalseStartsComeOutAsContent) {
    const std::vector<std::pair<F, std::string>> false_starts = {
        {F::Hermes, "<tool_call>not json</tool_call> and then text"},
        {F::Hermes, "Look: <tool_call>{\"arguments\": {\"x\": 1}, \"nam\": \"f\"}</tool_call>"},
        {F::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>"},
        {F::Llama3Json, "{\"answer\": 42, \"why\": {\"name\": \"a\"}}"},
        {F::Llama3Json, "{\"name\": 7, \"parameters\": {}}"},
        {F::Mistral, "[1, 2, {\"name\": \"a\", \"arguments\": {}}]"},
        {F::Mistral, "[TOOL_CALLS]bad name[ARGS]{}"},
    };
    for (const auto& [f, text] : false_starts) {
        SCOPED_TRACE(text);
        expect_streams(f, text, text, {});
    }
    // A call to a tool the request does not have.
    const std::string rm = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": " + kLongArgs + "}</tool_call>";
    expect_streams(F::Hermes, rm, rm, {}, {"get_weather"});
    // parallel_tool_calls false and an array of two: held whole, then text.
    const std::string two =
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": " + kLongArgs + "}, {\"name\": \"b\", \"arguments\": {}}]";
    expect_streams(F::Mistral, two, two, {}, {}, /*one_call=*/true);
}

// The arguments go out while the call is still being written, not when it is complete.
TEST(ToolCallStreaming, ArgumentsGoOutBeforeTheCallCloses) {
    ToolCallParser p(F::Hermes);
    ToolCallDelta d = p.feed("Hi <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa");
    EXPECT_EQ(d.content, "Hi");
    ASSERT_EQ(d.pieces.size(), 2u);
    EXPECT_EQ(d.pieces[1].call, 0);
    EXPECT_EQ(d.pieces[1].name, "get_weather");
    EXPECT_EQ(d.pieces[1].text, "{\"city\":\"Pa");
    EXPECT_TRUE(d.calls.empty());
    d = p.feed("ris\"}}\n</tool");
    ASSERT_EQ(d.pieces.size(), 1u);
    EXPECT_EQ(d.pieces[0].text, "ris\"}");
    EXPECT_TRUE(d.pieces[0].name.empty());
    ASSERT_EQ(d.calls.size(), 1u);  // complete when its object closes
    d = p.feed("_call>");
    EXPECT_TRUE(d.pieces.empty());
    EXPECT_EQ(p.finish().content, "");
}

// Ids: one per call, given with its first piece; the calls keep the joined arguments.
TEST(ToolCallStreaming, ChoiceToolCallsGiveIds) {
    ChoiceToolCalls c(ToolCallSetup{F::Forced, {}, false, true});
    ToolCallDelta d = c.feed(R"([{"name":"a","arguments":{"x":)", false);
    ASSERT_EQ(c.calls().size(), 1u);
    const std::string id = c.id(0);
    EXPECT_EQ(id.rfind("call_", 0), 0u);
    c.feed(R"(1}},{"name":"b","arguments":{}}])", true);
    ASSERT_EQ(c.calls().size(), 2u);
    EXPECT_EQ(c.id(0), id);
    EXPECT_NE(c.id(1), id);
    EXPECT_EQ(c.calls()[0].arguments, R"({"x":1})");
    EXPECT_EQ(c.calls()[1].arguments, "{}");
}

}  // namespace
}  // namespace peregrine::server
