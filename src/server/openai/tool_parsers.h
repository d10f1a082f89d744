// Tool calls in a model's own words (chat tool_choice "auto"): the generated text is split into
// content and calls, in one of the formats models are trained on:
//
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (several allowed;
//                Qwen 2.5 / 3, Hermes 2 Pro)
//   llama3_json  {"name": "f", "parameters": {...}}, possibly after <|python_tag|>, several
//                separated by ';' (Llama 3.1-3.3)
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...], or the newer
//                [TOOL_CALLS]f[ARGS]{...} (one marker per call)
//
// The parser is incremental: feed() returns the content that can no longer be part of a call and
// the calls completed so far; only text that may still be the start of a marker is held back.
// parse_tool_calls(text) is feed(text) then finish(), so streamed and whole answers agree.
// Text that looks like a call but does not parse stays content: no text is ever dropped, except
// the whitespace around calls. Special tokens are not in the engine's output text, so a bare JSON
// call object (llama3_json) or array (mistral) at the very start of the answer counts as a call.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine::server {

enum class ToolCallFormat { None, Hermes, Llama3Json, Mistral };

// The --tool-call-parser values: "none", "hermes", "llama3_json", "mistral" (nullopt otherwise;
// "auto" is detect_tool_call_format's).
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);
// From a chat template's source: it writes the markers of the format the model was trained on.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

struct ParsedToolCall {
    std::string name;
    std::string arguments;  // a JSON object, compact
};

struct ToolCallDelta {
    std::string content;
    std::vector<ParsedToolCall> calls;
};

class ToolCallParser {
  public:
    // `tool_names`: the request's tools; a call naming another one stays text. Empty: any name.
    // `one_call` (parallel_tool_calls false): after the first call everything is text, and a
    // block of several calls (a mistral array) is text too.
    explicit ToolCallParser(ToolCallFormat format, std::vector<std::string> tool_names = {}, bool one_call = false);

    ToolCallDelta feed(std::string_view text);
    // The end of the answer: what was held back, as calls or content.
    ToolCallDelta finish();
    bool called() const { return called_; }

  private:
    struct Marker {
        size_t at;   // from pos_
        size_t len;  // the marker's text (a bare call: the whitespace / ';' before it)
        bool bare;   // a call without its marker token
    };
    enum class Status { NeedMore, Invalid, Calls };
    struct Block {
        Status status = Status::NeedMore;
        std::vector<ParsedToolCall> calls;
        size_t consumed = 0;  // from pos_, marker included
    };

    void step(bool final, ToolCallDelta& out);
    std::optional<Marker> find_marker(std::string_view rest) const;
    size_t held_back(std::string_view rest) const;
    Block parse_block(std::string_view rest, const Marker& m, bool final) const;
    Block parse_hermes(std::string_view body, bool final) const;
    Block parse_json_calls(std::string_view body, bool final) const;
    Block parse_mistral_named(std::string_view body, bool final) const;
    std::optional<ParsedToolCall> call_of(std::string_view json) const;
    void emit(std::string_view text, ToolCallDelta& out);
    // Bare calls: at the start of the answer; llama3_json also right after a call (`{...}; {...}`).
    bool searching() const { return format_ != ToolCallFormat::None && !(one_call_ && called_); }
    bool bare_allowed() const { return !wrote_text_ || (format_ == ToolCallFormat::Llama3Json && after_call_); }

    ToolCallFormat format_;
    std::vector<std::string> names_;
    bool one_call_;
    std::string buf_;
    size_t pos_ = 0;           // buf_ before it is decided (content sent or calls parsed)
    std::string pending_ws_;   // whitespace held until text follows (it is dropped before a call)
    bool wrote_text_ = false;  // non-whitespace content went out
    bool called_ = false;
    bool after_call_ = false;  // nothing but whitespace since the last call
};

// The whole answer at once.
ToolCallDelta parse_tool_calls(ToolCallFormat format, std::string_view text, std::vector<std::string> tool_names = {},
                               bool one_call = false);

}  // namespace peregrine::server
