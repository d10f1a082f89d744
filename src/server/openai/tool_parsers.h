// Tool calls in a model's own words (chat tool_choice "auto"): the generated text is split into
// content and calls, in one of the formats models are trained on:
//
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (several allowed;
//                Qwen 2.5 / 3, Hermes 2 Pro)
//   llama3_json  {"name": "f", "parameters": {...}}, possibly after <|python_tag|>, several
//                separated by ';' (Llama 3.1-3.3)
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...], or the newer
//                [TOOL_CALLS]f[ARGS]{...} (one marker per call)
//   forced       [{"name": "f", "arguments": {...}}, ...] and nothing else: the answer of
//                tool_choice "required" / named, which the grammar wrote (not a model's format)
//
// The parser is incremental: feed() returns, in order, the content that can no longer be part of
// a call and the calls as they grow: a call's name once it is known, then its arguments' text
// piece by piece as the model writes it (json_call_scanner.h says when a call is committed and
// how its arguments grow). Only text that may still be a marker or an uncommitted call is held.
// parse_tool_calls(text) is feed(text) then finish(), so streamed and whole answers agree.
// Text that looks like a call but turns out not to be one stays content: no text is dropped,
// except the whitespace around calls and, after a committed call, the rest of its block when it
// goes wrong. Special tokens are not in the engine's output text, so a bare JSON call object
// (llama3_json) or array (mistral) at the very start of the answer counts as a call.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai/json_call_scanner.h"

namespace peregrine::server {

enum class ToolCallFormat { None, Hermes, Llama3Json, Mistral, Forced };

// The --tool-call-parser values: "none", "hermes", "llama3_json", "mistral" (nullopt otherwise;
// "auto" is detect_tool_call_format's; Forced is no model's and has no such name).
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);
// From a chat template's source: it writes the markers of the format the model was trained on.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

struct ParsedToolCall {
    std::string name;
    std::string arguments;  // a JSON object, whitespace outside strings left out
};

// One piece of the streamed answer: content, or a call's next part.
struct ToolCallPiece {
    int call = -1;     // -1: content; else the call's index in the answer (0, 1, ...)
    std::string name;  // a call's first piece only
    std::string text;  // the content, or the next piece of the call's arguments
};

struct ToolCallDelta {
    std::string content;                // the content pieces, joined
    std::vector<ParsedToolCall> calls;  // the calls completed here (their pieces came already)
    std::vector<ToolCallPiece> pieces;  // content and calls in order; a call's argument pieces
                                        // join into its ParsedToolCall::arguments exactly
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
    enum class Start { NeedMore, Invalid, Scanning };
    // A marker found and its calls being read: buf_ from pos_ (the marker) is held until the
    // block is decided; the scanner reads from json_at.
    struct Block {
        Marker m;
        std::optional<JsonCallScanner> scan;
        size_t json_at = 0;
        int first_index = 0;       // the answer's index of the block's first call
        std::vector<size_t> sent;  // per call announced: its arguments' bytes sent
        size_t completed = 0;      // calls reported in ToolCallDelta::calls
        size_t tags_judged = 0;    // hermes: closing tags before this (from json_at) were inside strings
    };

    void step(bool final, ToolCallDelta& out);
    std::optional<Marker> find_marker(std::string_view rest) const;
    size_t held_back(std::string_view rest) const;
    Start start_scan(std::string_view rest, bool final);
    bool advance_block(bool final, ToolCallDelta& out);  // true: the block is decided
    void publish(ToolCallDelta& out);
    void reject_block(std::string_view rest, ToolCallDelta& out);
    void emit(std::string_view text, ToolCallDelta& out);
    // Bare calls: at the start of the answer; llama3_json also right after a call (`{...}; {...}`).
    bool searching() const { return format_ != ToolCallFormat::None && !(one_call_ && called_); }
    bool bare_allowed() const { return !wrote_text_ || (format_ == ToolCallFormat::Llama3Json && after_call_); }

    ToolCallFormat format_;
    std::vector<std::string> names_;
    bool one_call_;
    std::string buf_;
    size_t pos_ = 0;  // buf_ before it is decided (content sent or calls parsed)
    std::optional<Block> open_;
    int calls_announced_ = 0;  // the next call's index
    std::string pending_ws_;   // whitespace held until text follows (it is dropped before a call)
    bool wrote_text_ = false;  // non-whitespace content went out
    bool called_ = false;
    bool after_call_ = false;  // nothing but whitespace since the last call
};

// `more` after `into`: the content joined, the pieces of one call merged, the calls appended.
void append_delta(ToolCallDelta& into, ToolCallDelta more);

// The whole answer at once.
ToolCallDelta parse_tool_calls(ToolCallFormat format, std::string_view text, std::vector<std::string> tool_names = {},
                               bool one_call = false);

}  // namespace peregrine::server
