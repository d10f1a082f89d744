#include "server/openai/tool_parsers.h"

#include <algorithm>

#include "server/openai/json.h"

namespace peregrine::server {

namespace {

constexpr std::string_view kWhitespace = " \t\r\n";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";

std::string_view marker_of(ToolCallFormat f) {
    switch (f) {
        case ToolCallFormat::Hermes:
            return kHermesOpen;
        case ToolCallFormat::Llama3Json:
            return kPythonTag;
        case ToolCallFormat::Mistral:
            return kMistralCalls;
        case ToolCallFormat::Forced:
        case ToolCallFormat::None:
            break;
    }
    return {};
}

bool is_prefix_of(std::string_view part, std::string_view whole) {
    return part.size() <= whole.size() && whole.substr(0, part.size()) == part;
}

// The length of the longest end of `s` that begins `token` (0 when none), the whole token aside.
size_t partial_suffix(std::string_view s, std::string_view token) {
    for (size_t k = std::min(token.empty() ? 0 : token.size() - 1, s.size()); k > 0; --k)
        if (s.substr(s.size() - k) == token.substr(0, k)) return k;
    return 0;
}

void add_piece(ToolCallDelta& out, int call, std::string name, std::string_view text) {
    if (call < 0) out.content.append(text);
    if (text.empty() && name.empty()) return;
    if (!out.pieces.empty() && out.pieces.back().call == call && name.empty()) {
        out.pieces.back().text.append(text);
        return;
    }
    out.pieces.push_back({call, std::move(name), std::string(text)});
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_named(std::string_view name) {
    for (ToolCallFormat f :
         {ToolCallFormat::None, ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::Mistral})
        if (name == tool_call_format_name(f)) return f;
    return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::Hermes:
            return "hermes";
        case ToolCallFormat::Llama3Json:
            return "llama3_json";
        case ToolCallFormat::Mistral:
            return "mistral";
        case ToolCallFormat::Forced:
            return "forced";
        case ToolCallFormat::None:
            break;
    }
    return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view t) {
    if (t.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::Hermes;
    if (t.find(kMistralCalls) != std::string_view::npos) return ToolCallFormat::Mistral;
    if (t.find(kPythonTag) != std::string_view::npos || t.find("ipython") != std::string_view::npos)
        return ToolCallFormat::Llama3Json;
    return ToolCallFormat::None;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, std::vector<std::string> tool_names, bool one_call)
    : format_(format), names_(std::move(tool_names)), one_call_(one_call) {}

ToolCallDelta ToolCallParser::feed(std::string_view text) {
    ToolCallDelta out;
    buf_.append(text);
    step(false, out);
    return out;
}

ToolCallDelta ToolCallParser::finish() {
    ToolCallDelta out;
    step(true, out);
    if (!called_ && !pending_ws_.empty()) add_piece(out, -1, {}, pending_ws_);
    pending_ws_.clear();
    return out;
}

void ToolCallParser::step(bool final, ToolCallDelta& out) {
    while (pos_ < buf_.size()) {
        if (open_) {
            if (!advance_block(final, out)) return;  // never when final
            continue;
        }
        std::string_view rest(buf_);
        rest.remove_prefix(pos_);
        const std::optional<Marker> m = searching() ? find_marker(rest) : std::nullopt;
        if (!m) {
            const size_t n = final || !searching() ? rest.size() : rest.size() - held_back(rest);
            emit(rest.substr(0, n), out);
            pos_ += n;
            return;
        }
        emit(rest.substr(0, m->at), out);
        pos_ += m->at;
        open_.emplace();
        open_->m = Marker{0, m->len, m->bare};
    }
}

std::optional<ToolCallParser::Marker> ToolCallParser::find_marker(std::string_view rest) const {
    const std::string_view token = marker_of(format_);
    // A bare call: only whitespace (llama3_json: or ';' between calls) before its bracket, at the
    // start of the answer or right after calls. A marker token there wins.
    if (format_ != ToolCallFormat::Hermes && bare_allowed()) {
        const bool llama = format_ == ToolCallFormat::Llama3Json;
        const size_t i = rest.find_first_not_of(llama ? " \t\r\n;" : kWhitespace);
        if (i != std::string_view::npos && rest[i] == (llama ? '{' : '[') &&
            (token.empty() || !is_prefix_of(rest.substr(i, token.size()), token)))
            return Marker{0, i, true};
    }
    if (token.empty()) return std::nullopt;
    const size_t at = rest.find(token);
    if (at == std::string_view::npos) return std::nullopt;
    return Marker{at, token.size(), false};
}

size_t ToolCallParser::held_back(std::string_view rest) const {
    if (format_ != ToolCallFormat::Hermes && bare_allowed()) {
        const bool llama = format_ == ToolCallFormat::Llama3Json;
        if (rest.find_first_not_of(llama ? " \t\r\n;" : kWhitespace) == std::string_view::npos) return rest.size();
    }
    return partial_suffix(rest, marker_of(format_));
}

// Where the block's JSON begins and which shape it has; mistral's `name[ARGS]` is read here.
ToolCallParser::Start ToolCallParser::start_scan(std::string_view rest, bool final) {
    Block& b = *open_;
    const std::string_view body = rest.substr(b.m.len);
    const Start wait = final ? Start::Invalid : Start::NeedMore;
    const size_t i = body.find_first_not_of(kWhitespace);
    if (i == std::string_view::npos) return wait;
    using Shape = JsonCallScanner::Shape;
    const char c = body[i];
    std::optional<Shape> shape;
    std::string name;
    size_t at = i;
    if (c == '{' && format_ != ToolCallFormat::Mistral && format_ != ToolCallFormat::Forced) {
        shape = Shape::Call;
    } else if (c == '[' && format_ != ToolCallFormat::Hermes) {
        shape = Shape::Calls;
    } else if (format_ == ToolCallFormat::Mistral && !b.m.bare) {  // name[ARGS]{...}
        const size_t end =
            body.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.", i);
        const std::string_view after = end == std::string_view::npos ? std::string_view() : body.substr(end);
        if (after.size() < kMistralArgs.size() && is_prefix_of(after, kMistralArgs)) return wait;
        if (end == i || after.substr(0, kMistralArgs.size()) != kMistralArgs) return Start::Invalid;
        at = body.find_first_not_of(kWhitespace, end + kMistralArgs.size());
        if (at == std::string_view::npos) return wait;
        if (body[at] != '{') return Start::Invalid;
        shape = Shape::Arguments;
        name = std::string(body.substr(i, end - i));
    }
    if (!shape) return Start::Invalid;
    b.json_at = b.m.len + at;
    b.first_index = calls_announced_;
    b.scan.emplace(*shape, &names_, one_call_, std::move(name));
    return Start::Scanning;
}

bool ToolCallParser::advance_block(bool final, ToolCallDelta& out) {
    Block& b = *open_;
    const std::string_view rest = std::string_view(buf_).substr(pos_);
    if (!b.scan) {
        const Start s = start_scan(rest, final);
        if (s == Start::NeedMore) return false;
        if (s == Start::Invalid) {
            reject_block(rest, out);
            return true;
        }
    }
    // hermes: the block ends at its closing tag (the JSON is read up to it; a partial tag at the
    // end is not given to the scanner). A tag inside one of the JSON's strings (an argument that
    // quotes "</tool_call>") is text: each tag is judged once, with the JSON scanned up to it.
    std::string_view json = rest.substr(b.json_at);
    bool json_final = final;
    size_t close = std::string_view::npos;
    if (format_ == ToolCallFormat::Hermes) {
        for (size_t c = json.find(kHermesClose, b.tags_judged); c != std::string_view::npos;
             c = json.find(kHermesClose, b.tags_judged)) {
            b.scan->scan(json.substr(0, c), false);
            b.tags_judged = c + 1;
            if (b.scan->state() != JsonCallScanner::State::Scanning || !b.scan->in_string()) {
                close = c;
                break;
            }
        }
    }
    if (close != std::string_view::npos) {
        json = json.substr(0, close);
        json_final = true;
    } else if (format_ == ToolCallFormat::Hermes) {
        json.remove_suffix(partial_suffix(json, kHermesClose));
    }
    b.scan->scan(json, json_final);
    publish(out);
    if (b.scan->state() == JsonCallScanner::State::Scanning) return false;
    if (b.scan->state() == JsonCallScanner::State::Invalid) {
        reject_block(rest, out);
        return true;
    }
    size_t end = b.json_at + b.scan->end();
    if (close != std::string_view::npos) {
        end = b.json_at + close + kHermesClose.size();  // what is left inside the tags is dropped
    } else if (format_ == ToolCallFormat::Hermes) {
        // The object ended before its closing tag: wait for the tag, which is consumed with it.
        const size_t next = rest.find_first_not_of(kWhitespace, end);
        if (!final && (next == std::string_view::npos || is_prefix_of(rest.substr(next), kHermesClose))) return false;
    }
    // Calls cut short (the text ended, or the rest of the block went wrong): as written so far.
    const std::vector<ScannedCall>& calls = b.scan->calls();
    for (size_t k = b.completed; k < b.sent.size(); ++k) out.calls.push_back({calls[k].name, calls[k].arguments});
    pos_ += end;
    open_.reset();
    pending_ws_.clear();
    called_ = after_call_ = true;
    return true;
}

// The committed calls' new parts as pieces: each ready call's name once, then its arguments'
// growth; a complete call also as a ParsedToolCall.
void ToolCallParser::publish(ToolCallDelta& out) {
    Block& b = *open_;
    if (!b.scan->committed()) return;
    const std::vector<ScannedCall>& calls = b.scan->calls();
    for (size_t k = 0; k < calls.size() && calls[k].ready; ++k) {
        const ScannedCall& c = calls[k];
        const int index = b.first_index + static_cast<int>(k);
        if (k == b.sent.size()) {
            b.sent.push_back(c.arguments.size());
            calls_announced_ = index + 1;
            add_piece(out, index, c.name, c.arguments);
        } else if (c.arguments.size() > b.sent[k]) {
            add_piece(out, index, {}, std::string_view(c.arguments).substr(b.sent[k]));
            b.sent[k] = c.arguments.size();
        }
        if (c.complete && k == b.completed) {
            out.calls.push_back({c.name, c.arguments});
            ++b.completed;
        }
    }
}

// The marker is text after all (a bare call: its bracket too, which ends bare calls).
void ToolCallParser::reject_block(std::string_view rest, ToolCallDelta& out) {
    const size_t n = open_->m.len + (open_->m.bare ? 1 : 0);
    open_.reset();
    emit(rest.substr(0, n), out);
    pos_ += n;
}

void ToolCallParser::emit(std::string_view text, ToolCallDelta& out) {
    const size_t last = text.find_last_not_of(kWhitespace);
    if (last == std::string_view::npos) {
        pending_ws_.append(text);
        return;
    }
    add_piece(out, -1, {}, pending_ws_);
    add_piece(out, -1, {}, text.substr(0, last + 1));
    pending_ws_ = std::string(text.substr(last + 1));
    wrote_text_ = true;
    after_call_ = false;
}

void append_delta(ToolCallDelta& into, ToolCallDelta more) {
    for (ToolCallPiece& p : more.pieces) add_piece(into, p.call, std::move(p.name), p.text);  // content too
    for (ParsedToolCall& c : more.calls) into.calls.push_back(std::move(c));
}

ToolCallDelta parse_tool_calls(ToolCallFormat format, std::string_view text, std::vector<std::string> tool_names,
                               bool one_call) {
    ToolCallParser p(format, std::move(tool_names), one_call);
    ToolCallDelta out = p.feed(text);
    append_delta(out, p.finish());
    return out;
}

}  // namespace peregrine::server
