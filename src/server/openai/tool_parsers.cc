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
        case ToolCallFormat::None:
            break;
    }
    return {};
}

std::string_view trimmed(std::string_view s) {
    const size_t b = s.find_first_not_of(kWhitespace);
    if (b == std::string_view::npos) return {};
    return s.substr(b, s.find_last_not_of(kWhitespace) - b + 1);
}

// One past the bracket closing the object or array that opens at s[at] ('{' or '['); npos when
// the text ends first. Strings (with escapes) are skipped; whether the brackets pair up is left
// to the JSON parser that reads the span afterwards.
size_t json_value_end(std::string_view s, size_t at) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = at; i < s.size(); ++i) {
        const char c = s[i];
        if (in_string) {
            if (c == '\\')
                ++i;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            ++depth;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return i + 1;
        }
    }
    return std::string_view::npos;
}

bool is_prefix_of(std::string_view part, std::string_view whole) {
    return part.size() <= whole.size() && whole.substr(0, part.size()) == part;
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
    if (!called_) out.content += pending_ws_;
    pending_ws_.clear();
    return out;
}

void ToolCallParser::step(bool final, ToolCallDelta& out) {
    while (pos_ < buf_.size()) {
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
        rest.remove_prefix(m->at);
        Block b = parse_block(rest, *m, final);
        if (b.status == Status::NeedMore) return;  // never when final
        if (one_call_ && b.calls.size() > 1) b.status = Status::Invalid;
        if (b.status == Status::Invalid) {
            // The marker is text after all (a bare call: its bracket too, which ends bare calls).
            const size_t n = m->len + (m->bare ? 1 : 0);
            emit(rest.substr(0, n), out);
            pos_ += n;
            continue;
        }
        pending_ws_.clear();
        for (ParsedToolCall& c : b.calls) out.calls.push_back(std::move(c));
        called_ = after_call_ = true;
        pos_ += b.consumed;
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
            !is_prefix_of(rest.substr(i, token.size()), token))
            return Marker{0, i, true};
    }
    const size_t at = rest.find(token);
    if (at == std::string_view::npos) return std::nullopt;
    return Marker{at, token.size(), false};
}

size_t ToolCallParser::held_back(std::string_view rest) const {
    if (format_ != ToolCallFormat::Hermes && bare_allowed()) {
        const bool llama = format_ == ToolCallFormat::Llama3Json;
        if (rest.find_first_not_of(llama ? " \t\r\n;" : kWhitespace) == std::string_view::npos) return rest.size();
    }
    const std::string_view token = marker_of(format_);
    for (size_t k = std::min(token.size() - 1, rest.size()); k > 0; --k)
        if (rest.substr(rest.size() - k) == token.substr(0, k)) return k;
    return 0;
}

ToolCallParser::Block ToolCallParser::parse_block(std::string_view rest, const Marker& m, bool final) const {
    Block b;
    const std::string_view body = rest.substr(m.len);
    if (format_ == ToolCallFormat::Hermes) {
        b = parse_hermes(body, final);
    } else if (format_ == ToolCallFormat::Mistral && !m.bare) {
        const size_t i = body.find_first_not_of(kWhitespace);
        if (i == std::string_view::npos)
            b.status = final ? Status::Invalid : Status::NeedMore;
        else
            b = body[i] == '[' ? parse_json_calls(body, final) : parse_mistral_named(body, final);
    } else {
        b = parse_json_calls(body, final);
    }
    b.consumed += m.len;
    return b;
}

ToolCallParser::Block ToolCallParser::parse_hermes(std::string_view body, bool final) const {
    Block b;
    const size_t close = body.find(kHermesClose);
    if (close == std::string_view::npos && !final) return b;
    // An unclosed block at the end: the answer may have stopped right after the object.
    const std::string_view inner = close == std::string_view::npos ? body : body.substr(0, close);
    std::optional<ParsedToolCall> call = call_of(trimmed(inner));
    if (!call) {
        b.status = Status::Invalid;
        return b;
    }
    b.status = Status::Calls;
    b.calls.push_back(std::move(*call));
    b.consumed = close == std::string_view::npos ? body.size() : close + kHermesClose.size();
    return b;
}

// One JSON object (a call) or array (of calls) after optional whitespace.
ToolCallParser::Block ToolCallParser::parse_json_calls(std::string_view body, bool final) const {
    Block b;
    const size_t i = body.find_first_not_of(kWhitespace);
    if (i == std::string_view::npos) {
        b.status = final ? Status::Invalid : Status::NeedMore;
        return b;
    }
    if (body[i] != '{' && body[i] != '[') {
        b.status = Status::Invalid;
        return b;
    }
    const size_t end = json_value_end(body, i);
    if (end == std::string_view::npos) {
        b.status = final ? Status::Invalid : Status::NeedMore;
        return b;
    }
    const std::string_view span = body.substr(i, end - i);
    b.status = Status::Invalid;
    if (body[i] == '{') {
        std::optional<ParsedToolCall> call = call_of(span);
        if (!call) return b;
        b.calls.push_back(std::move(*call));
    } else {
        const Json list = Json::parse(span, nullptr, false);
        if (!list.is_array() || list.empty()) return b;
        for (const Json& item : list) {
            std::optional<ParsedToolCall> call = call_of(item.dump());
            if (!call) return b;
            b.calls.push_back(std::move(*call));
        }
    }
    b.status = Status::Calls;
    b.consumed = end;
    return b;
}

// name[ARGS]{...}: the function's name, then its arguments object.
ToolCallParser::Block ToolCallParser::parse_mistral_named(std::string_view body, bool final) const {
    Block b;
    b.status = Status::Invalid;
    const size_t start = body.find_first_not_of(kWhitespace);
    const size_t name_end =
        body.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.", start);
    const std::string_view after = name_end == std::string_view::npos ? std::string_view() : body.substr(name_end);
    if (after.size() < kMistralArgs.size() && is_prefix_of(after, kMistralArgs)) {
        if (!final) b.status = Status::NeedMore;
        return b;
    }
    if (name_end == start || after.substr(0, kMistralArgs.size()) != kMistralArgs) return b;
    const size_t open = body.find_first_not_of(kWhitespace, name_end + kMistralArgs.size());
    if (open == std::string_view::npos) {
        if (!final) b.status = Status::NeedMore;
        return b;
    }
    if (body[open] != '{') return b;
    const size_t end = json_value_end(body, open);
    if (end == std::string_view::npos) {
        if (!final) b.status = Status::NeedMore;
        return b;
    }
    const Json args = Json::parse(body.substr(open, end - open), nullptr, false);
    if (!args.is_object()) return b;
    const Json call = {{"name", std::string(body.substr(start, name_end - start))}, {"arguments", args}};
    std::optional<ParsedToolCall> parsed = call_of(call.dump());
    if (!parsed) return b;
    b.status = Status::Calls;
    b.calls.push_back(std::move(*parsed));
    b.consumed = end;
    return b;
}

// {"name": ..., "arguments" (or "parameters"): {...} or its JSON text}; nullopt when it is not one.
std::optional<ParsedToolCall> ToolCallParser::call_of(std::string_view text) const {
    const Json j = Json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
    const std::string n = name->get<std::string>();
    if (!names_.empty() && std::find(names_.begin(), names_.end(), n) == names_.end()) return std::nullopt;
    auto args = j.find("arguments");
    if (args == j.end()) args = j.find("parameters");
    Json a = args == j.end() ? Json::object() : *args;
    if (a.is_string()) a = Json::parse(a.get<std::string>(), nullptr, false);
    if (!a.is_object()) return std::nullopt;
    return ParsedToolCall{n, dump(a)};
}

void ToolCallParser::emit(std::string_view text, ToolCallDelta& out) {
    const size_t last = text.find_last_not_of(kWhitespace);
    if (last == std::string_view::npos) {
        pending_ws_.append(text);
        return;
    }
    out.content += pending_ws_;
    out.content.append(text.substr(0, last + 1));
    pending_ws_ = std::string(text.substr(last + 1));
    wrote_text_ = true;
    after_call_ = false;
}

ToolCallDelta parse_tool_calls(ToolCallFormat format, std::string_view text, std::vector<std::string> tool_names,
                               bool one_call) {
    ToolCallParser p(format, std::move(tool_names), one_call);
    ToolCallDelta out = p.feed(text);
    ToolCallDelta rest = p.finish();
    out.content += rest.content;
    for (ParsedToolCall& c : rest.calls) out.calls.push_back(std::move(c));
    return out;
}

}  // namespace peregrine::server
