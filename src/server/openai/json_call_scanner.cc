#include "server/openai/json_call_scanner.h"

#include <algorithm>

#include "server/openai/json.h"

namespace peregrine::server {

namespace {

bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

}  // namespace

JsonCallScanner::JsonCallScanner(Shape shape, const std::vector<std::string>* names, bool hold, std::string name)
    : shape_(shape), names_(names), hold_(hold) {
    call_depth_ = shape == Shape::Calls ? 2 : 1;
    if (shape == Shape::Arguments) {
        calls_.push_back({});
        if (name.empty() || !allowed(name)) state_ = State::Invalid;
        calls_.back().name = std::move(name);
    }
}

bool JsonCallScanner::allowed(const std::string& name) const {
    return !names_ || names_->empty() || std::find(names_->begin(), names_->end(), name) != names_->end();
}

void JsonCallScanner::scan(std::string_view text, bool final) {
    while (i_ < text.size() && state_ == State::Scanning) step(text, i_++);
    if (!final || state_ != State::Scanning) return;
    // The text ended inside the value: calls as written once committed, else not calls.
    i_ = text.size();
    state_ = committed_ ? State::Done : State::Invalid;
}

void JsonCallScanner::step(std::string_view text, size_t at) {
    const char c = text[at];
    if (dropping_) return skip(c);
    if (in_args_ && (in_string_ || !is_ws(c))) calls_.back().arguments += c;
    if (in_string_) {
        if (escape_) {
            escape_ = false;
        } else if (c == '\\') {
            escape_ = true;
        } else if (c == '"') {
            in_string_ = false;
            if (slot_ == Slot::KeyString && depth_ == call_depth_ && !in_value_) {
                key_.assign(text.substr(key_begin_, at + 1 - key_begin_));
                slot_ = Slot::Colon;
            } else if (in_value_ && depth_ == call_depth_) {
                value_ends(text, at + 1);
            }
        }
        return;
    }
    // A number or literal at the call's level ends before whitespace or punctuation.
    if (scalar_ && (is_ws(c) || c == ',' || c == '}' || c == ']')) value_ends(text, at);
    if (dropping_) return skip(c);
    if (state_ != State::Scanning || is_ws(c)) return;
    if (c == '{' || c == '[' || c == '}' || c == ']') return bracket(text, at, c);
    if (in_call_ && depth_ == call_depth_ && !in_value_) return call_level(at, c);
    if (in_value_ || in_args_) {  // inside a value (Shape::Arguments: the arguments object)
        if (c == '"') in_string_ = true;
        return;
    }
    // Between the calls of an array (or before the value): only commas belong there.
    if (!(shape_ == Shape::Calls && depth_ == 1 && c == ',')) bad();
}

void JsonCallScanner::skip(char c) {
    if (in_string_) {
        if (escape_)
            escape_ = false;
        else if (c == '\\')
            escape_ = true;
        else if (c == '"')
            in_string_ = false;
    } else if (c == '"') {
        in_string_ = true;
    } else if (c == '{' || c == '[') {
        ++depth_;
    } else if ((c == '}' || c == ']') && --depth_ <= 0) {
        done();
    }
}

void JsonCallScanner::bracket(std::string_view text, size_t at, char c) {
    if (c == '{' || c == '[') {
        if (in_call_ && depth_ == call_depth_ && !in_value_) {
            if (slot_ != Slot::Value) return bad();
            value_begins(at, c);
            if (state_ != State::Scanning) return;
            if (dropping_) {
                ++depth_;
                return;
            }
            if (in_args_) calls_.back().arguments = "{";
        }
        ++depth_;
        if (in_value_ || in_args_) return;
        if (depth_ == 1) {  // the value's opening bracket
            if (c != (shape_ == Shape::Calls ? '[' : '{')) return bad();
            if (shape_ == Shape::Calls) return;
            if (shape_ == Shape::Arguments) {
                in_args_ = args_started_ = true;
                calls_.back().arguments = "{";
                update_ready();
                return;
            }
        }
        if (depth_ != call_depth_ || c != '{') return bad();  // an array holds call objects only
        in_call_ = true;
        call_begin_ = at;
        slot_ = Slot::Key;
        calls_.push_back({});
        args_started_ = name_seen_ = args_seen_ = false;
        return;
    }
    --depth_;
    if (in_value_ && depth_ == call_depth_) return value_ends(text, at + 1);  // a container value closed
    if (in_value_ || (shape_ == Shape::Arguments && depth_ > 0)) return;
    if (shape_ == Shape::Arguments && depth_ == 0) {
        in_args_ = false;
        ScannedCall& call = calls_.back();
        if (!Json::parse(call.arguments, nullptr, false).is_object()) return bad();
        call.complete = true;
        return done();
    }
    if (in_call_ && depth_ == call_depth_ - 1) {
        call_ends(text, at + 1);
        if (state_ == State::Scanning && depth_ == 0) done();
        return;
    }
    if (shape_ == Shape::Calls && depth_ == 0) return done();
    bad();
}

void JsonCallScanner::call_level(size_t at, char c) {
    if (slot_ == Slot::Value) {
        value_begins(at, c);
        if (c == '"') in_string_ = true;
        return;
    }
    // Punctuation: '"' opens a key, ':' comes after it, ',' after a value.
    static constexpr struct {
        Slot slot;
        char c;
        Slot next;
    } kSteps[] = {{Slot::Key, '"', Slot::KeyString}, {Slot::Colon, ':', Slot::Value}, {Slot::Next, ',', Slot::Key}};
    for (const auto& s : kSteps) {
        if (s.slot != slot_) continue;
        if (c != s.c) break;
        slot_ = s.next;
        if (c == '"') {
            in_string_ = true;
            key_begin_ = at;
        }
        return;
    }
    bad();
}

void JsonCallScanner::value_begins(size_t at, char c) {
    in_value_ = true;
    value_begin_ = at;
    scalar_ = c != '{' && c != '[' && c != '"';
    if (key_ == "\"arguments\"" || key_ == "\"parameters\"") {
        if (args_seen_ || (c != '{' && c != '"')) return bad();
        args_seen_ = true;
        in_args_ = c == '{';
        args_string_ = c == '"';
        if (in_args_) {
            args_started_ = true;
            update_ready();
        }
    } else if (key_ == "\"name\"") {
        if (name_seen_ || c != '"') return bad();
        name_seen_ = true;
    }
}

void JsonCallScanner::value_ends(std::string_view text, size_t end) {
    const std::string_view span = text.substr(value_begin_, end - value_begin_);
    ScannedCall& call = calls_.back();
    const bool was_string_args = args_string_;
    in_value_ = scalar_ = in_args_ = args_string_ = false;
    slot_ = Slot::Next;
    if (key_ == "\"name\"") {
        const Json name = Json::parse(span, nullptr, false);
        if (!name.is_string() || name.get<std::string>().empty() || !allowed(name.get<std::string>())) return bad();
        call.name = name.get<std::string>();
        update_ready();
    } else if (was_string_args) {
        const Json s = Json::parse(span, nullptr, false);
        const Json args = s.is_string() ? Json::parse(s.get<std::string>(), nullptr, false) : Json();
        if (!args.is_object()) return bad();
        call.arguments = dump(args);
        args_started_ = true;
        update_ready();
    }
}

void JsonCallScanner::call_ends(std::string_view text, size_t end) {
    in_call_ = false;
    ScannedCall& call = calls_.back();
    if (call.name.empty() || !Json::parse(text.substr(call_begin_, end - call_begin_), nullptr, false).is_object())
        return bad();
    if (!args_started_) call.arguments = "{}";
    call.complete = true;
    update_ready();
}

void JsonCallScanner::update_ready() {
    ScannedCall& call = calls_.back();
    call.ready = !call.name.empty() && (args_started_ || call.complete);
    if (call.ready && !hold_) committed_ = true;
}

void JsonCallScanner::done() {
    if (hold_ && !committed_ && calls_.size() == 1 && calls_[0].complete) committed_ = true;
    state_ = committed_ ? State::Done : State::Invalid;
}

void JsonCallScanner::bad() {
    if (!committed_) {
        state_ = State::Invalid;
        return;
    }
    // What went out stays; a call that had not (not ready) is dropped with the rest.
    if (!calls_.back().ready) calls_.pop_back();
    dropping_ = true;
    in_args_ = in_value_ = scalar_ = false;
    if (depth_ <= 0) done();
}

}  // namespace peregrine::server
