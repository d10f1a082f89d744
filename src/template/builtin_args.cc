// The Jinja builtins' argument helpers (builtins_internal.h).
#include <algorithm>
#include <cmath>

#include "template/builtins_internal.h"
#include "template/text.h"

namespace peregrine::jinja::builtin {

Value arg_or(const CallArgs& a, size_t pos, std::string_view name, Value dflt) {
    const Value* v = a.get(pos, name);
    return v && !v->is_undefined() ? *v : std::move(dflt);
}

bool bool_arg(const CallArgs& a, size_t pos, std::string_view name, bool dflt) {
    const Value* v = a.get(pos, name);
    return v && !v->is_undefined() ? v->truthy() : dflt;
}

int64_t int_arg(const CallArgs& a, size_t pos, std::string_view name, int64_t dflt) {
    const Value* v = a.get(pos, name);
    if (!v || v->is_undefined() || v->is_none()) return dflt;
    if (is_intlike(*v)) return int_of(*v);
    if (v->is_float()) {  // truncated, as Python's int(); past int64 (or inf / nan) it is an error
        const double f = v->as_float();
        if (!std::isfinite(f) || std::fabs(f) >= 9.2e18)
            throw ValueError("argument '" + std::string(name) + "' is out of the integer range");
        return static_cast<int64_t>(f);
    }
    throw ValueError("argument '" + std::string(name) + "' must be an integer, not " + std::string(v->type_name()));
}

const std::string* str_arg(const CallArgs& a, size_t pos, std::string_view name) {
    const Value* v = a.get(pos, name);
    if (!v || v->is_undefined() || v->is_none()) return nullptr;
    if (!v->is_string())
        throw ValueError("argument '" + std::string(name) + "' must be a string, not " + std::string(v->type_name()));
    return &v->as_string();
}

const std::string& need_string(const Value& v, std::string_view what) {
    if (!v.is_string()) throw ValueError(std::string(what) + " expects a string, got " + std::string(v.type_name()));
    return v.as_string();
}

Value str_value(Interpreter& in, std::string s) {
    in.check_string_size(s.size());
    return Value(std::move(s));
}

// A list of anything iterable (strings give characters, dicts keys); undefined gives [].
Array as_list(Interpreter& in, const Value& v) {
    return iterate(in, v);
}

// `a.b.0` attribute paths as filters take them (attribute="function.name").
Value attr_path(Interpreter& in, const Value& v, const Value& path) {
    if (is_intlike(path)) return get_item(in, v, path);
    const std::string& p = need_string(path, "attribute");
    Value cur = v;
    size_t start = 0;
    while (true) {
        const size_t dot = p.find('.', start);
        const std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ascii_digit) && part.size() < 18;
        cur = numeric && cur.is_array() ? get_item(in, cur, Value(static_cast<int64_t>(std::stoll(part))))
                                        : get_item(in, cur, Value(part));
        if (dot == std::string::npos) return cur;
        start = dot + 1;
    }
}

// Jinja's sort key: strings compared case-insensitively unless asked otherwise.
Value sort_key(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value(text::lower(v.as_string()));
    return v;
}

}  // namespace peregrine::jinja::builtin
