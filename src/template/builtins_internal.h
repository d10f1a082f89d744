// What the Jinja builtins' files share (builtins.cc: tests, globals and the entry points;
// methods.cc: str / list / dict methods; filters.cc): argument helpers and the pieces one file
// calls in another. Internal to src/template.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "template/interpreter.h"

namespace peregrine::jinja::builtin {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

// <cctype> on bytes of UTF-8 text: only ASCII counts (and no negative char reaches the C library).
inline bool ascii_digit(char c) {
    return c >= '0' && c <= '9';
}
inline bool ascii_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
inline bool ascii_alnum(char c) {
    return ascii_digit(c) || ascii_alpha(c);
}

// Argument `name` at position pos, or dflt where absent or undefined (int_arg: none too; str_arg:
// nullptr where absent). Wrong types are a ValueError naming the argument.
Value arg_or(const CallArgs& a, size_t pos, std::string_view name, Value dflt);
bool bool_arg(const CallArgs& a, size_t pos, std::string_view name, bool dflt);
int64_t int_arg(const CallArgs& a, size_t pos, std::string_view name, int64_t dflt);
const std::string* str_arg(const CallArgs& a, size_t pos, std::string_view name);
const std::string& need_string(const Value& v, std::string_view what);
// A string value, its size charged against the interpreter's limit.
Value str_value(Interpreter& in, std::string s);
// A list of anything iterable (strings give characters, dicts keys); undefined gives [].
Array as_list(Interpreter& in, const Value& v);
// `a.b.0` attribute paths as filters take them (attribute="function.name").
Value attr_path(Interpreter& in, const Value& v, const Value& path);
// Jinja's sort key: strings compared case-insensitively unless asked otherwise.
Value sort_key(const Value& v, bool case_sensitive);

// methods.cc: a str method called by name (the replace / center filters use them), a dict's
// items as [key, value] pairs, and a method bound to its object for get_attr.
Value string_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a);
Value items_of(Interpreter& in, const Object& o);
bool is_string_method(const std::string& n);
bool is_list_method(const std::string& n);
bool is_dict_method(const std::string& n);
Value bind_method(const Value& self, const std::string& name);

// filters.cc: every filter by name.
const std::unordered_map<std::string, FilterFn>& filters();

}  // namespace peregrine::jinja::builtin
