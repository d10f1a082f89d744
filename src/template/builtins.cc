// Filters, tests, methods of str / list / dict, and the global functions of the interpreter.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <unordered_map>

#include "template/interpreter.h"
#include "template/text.h"

namespace peregrine::jinja {

namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);
using MethodFn = Value (*)(Interpreter&, const Value&, CallArgs&);

// --- argument helpers ------------------------------------------------------------------------------

// <cctype> on bytes of UTF-8 text: only ASCII counts (and no negative char reaches the C library).
bool ascii_digit(char c) {
    return c >= '0' && c <= '9';
}
bool ascii_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool ascii_alnum(char c) {
    return ascii_digit(c) || ascii_alpha(c);
}

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

// --- string methods ---------------------------------------------------------------------------------

bool starts_or_ends(const Value& self, const Value* arg, bool start) {
    const std::string& s = self.as_string();
    auto test = [&](const Value& p) {
        const std::string& x = need_string(p, start ? "startswith" : "endswith");
        if (x.size() > s.size()) return false;
        return start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
    };
    if (!arg) throw ValueError(std::string(start ? "startswith" : "endswith") + "() takes at least 1 argument");
    if (arg->is_array()) {
        for (const Value& p : arg->as_array())
            if (test(p)) return true;
        return false;
    }
    return test(*arg);
}

Value string_list(Interpreter& in, std::vector<std::string> parts) {
    Array items;
    items.reserve(parts.size());
    for (auto& p : parts) items.emplace_back(std::move(p));
    return in.new_array(std::move(items));
}

int64_t py_find(const std::string& s, const std::string& sub, bool reverse) {
    const size_t k = reverse ? s.rfind(sub) : s.find(sub);
    if (k == std::string::npos) return -1;
    return static_cast<int64_t>(text::num_chars(std::string_view(s).substr(0, k)));
}

// Python str.format with {} / {0} / {name} fields (format specs are ignored) and {{ }} escapes.
std::string py_format(Interpreter& in, const std::string& fmt, const CallArgs& a) {
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        const char c = fmt[i];
        if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out += '{';
            ++i;
        } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
            out += '}';
            ++i;
        } else if (c == '{') {
            const size_t end = fmt.find('}', i);
            if (end == std::string::npos) throw ValueError("format: single '{' encountered");
            std::string field = fmt.substr(i + 1, end - i - 1);
            field = field.substr(0, field.find(':'));
            field = field.substr(0, field.find('!'));
            const Value* v = nullptr;
            if (field.empty()) {
                v = auto_index < a.args.size() ? &a.args[auto_index] : nullptr;
                ++auto_index;
            } else if (std::all_of(field.begin(), field.end(), ascii_digit) && field.size() < 9) {
                const size_t k = std::stoul(field);
                v = k < a.args.size() ? &a.args[k] : nullptr;
            } else {
                v = a.kwarg(field);
            }
            if (!v) throw ValueError("format: no value for field '" + field + "'");
            out += to_str(*v, in.limits().max_output_bytes);
            in.check_string_size(out.size());
            i = end;
        } else {
            out += c;
        }
    }
    return out;
}

Value string_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
    const std::string& s = self.as_string();
    if (name == "upper") return Value(text::upper(s));
    if (name == "lower" || name == "casefold") return Value(text::lower(s));
    if (name == "title") return Value(text::title(s));
    if (name == "capitalize") return Value(text::capitalize(s));
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string* set = str_arg(a, 0, "chars");
        return Value(text::strip(s, set, name != "rstrip", name != "lstrip"));
    }
    if (name == "startswith") return Value(starts_or_ends(self, a.get(0, "prefix"), true));
    if (name == "endswith") return Value(starts_or_ends(self, a.get(0, "suffix"), false));
    if (name == "split" || name == "rsplit") {
        const std::string* sep = str_arg(a, 0, "sep");
        if (sep && sep->empty()) throw ValueError("empty separator");
        const long maxsplit = static_cast<long>(int_arg(a, 1, "maxsplit", -1));
        return string_list(in, name == "split" ? text::split(s, sep, maxsplit) : text::rsplit(s, sep, maxsplit));
    }
    if (name == "splitlines") {
        std::vector<std::string> lines;
        size_t start = 0;
        for (size_t i = 0; i < s.size(); ++i) {
            if (s[i] == '\n' || s[i] == '\r') {
                lines.push_back(s.substr(start, i - start));
                if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
                start = i + 1;
            }
        }
        if (start < s.size()) lines.push_back(s.substr(start));
        return string_list(in, std::move(lines));
    }
    if (name == "replace") {
        const std::string* from = str_arg(a, 0, "old");
        const std::string* to = str_arg(a, 1, "new");
        if (!from || !to) throw ValueError("replace() takes two string arguments");
        const long count = static_cast<long>(int_arg(a, 2, "count", -1));
        // the size of the result before building it
        size_t n = 0;
        if (from->empty()) {
            n = text::num_chars(s) + 1;
        } else {
            for (size_t k = s.find(*from); k != std::string::npos; k = s.find(*from, k + from->size())) ++n;
        }
        if (count >= 0) n = std::min<size_t>(n, static_cast<size_t>(count));
        if (to->size() > from->size()) {
            const size_t grow = to->size() - from->size();
            if (n && grow > in.limits().max_output_bytes / n) in.check_string_size(in.limits().max_output_bytes + 1);
            in.check_string_size(s.size() + n * grow);
        }
        return Value(text::replace(s, *from, *to, count));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
        const std::string* sub = str_arg(a, 0, "sub");
        if (!sub) throw ValueError(name + "() takes a string argument");
        const int64_t k = py_find(s, *sub, name[0] == 'r');
        if (k < 0 && (name == "index" || name == "rindex")) throw ValueError("substring not found");
        return Value(k);
    }
    if (name == "count") {
        const std::string* sub = str_arg(a, 0, "sub");
        if (!sub) throw ValueError("count() takes a string argument");
        if (sub->empty()) return Value(static_cast<int64_t>(text::num_chars(s) + 1));
        int64_t n = 0;
        for (size_t k = s.find(*sub); k != std::string::npos; k = s.find(*sub, k + sub->size())) ++n;
        return Value(n);
    }
    if (name == "join") {
        std::string out;
        bool first = true;
        for (const Value& v : as_list(in, arg_or(a, 0, "iterable", Value()))) {
            if (!first) out += s;
            first = false;
            out += need_string(v, "str.join");
            in.check_string_size(out.size());
        }
        return Value(std::move(out));
    }
    if (name == "format") return Value(py_format(in, s, a));
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
        return Value(!s.empty() && std::all_of(s.begin(), s.end(), ascii_digit));
    if (name == "isalpha") return Value(!s.empty() && std::all_of(s.begin(), s.end(), ascii_alpha));
    if (name == "isalnum") return Value(!s.empty() && std::all_of(s.begin(), s.end(), ascii_alnum));
    if (name == "isspace") return Value(!s.empty() && std::all_of(s.begin(), s.end(), text::is_py_space));
    if (name == "isupper") return Value(text::has_cased(s, true) && !text::has_cased(s, false));
    if (name == "islower") return Value(text::has_cased(s, false) && !text::has_cased(s, true));
    if (name == "removeprefix" || name == "removesuffix") {
        const std::string* x = str_arg(a, 0, "fix");
        if (!x) throw ValueError(name + "() takes a string argument");
        if (name == "removeprefix") return Value(s.compare(0, x->size(), *x) == 0 ? s.substr(x->size()) : s);
        if (x->size() <= s.size() && s.compare(s.size() - x->size(), x->size(), *x) == 0)
            return Value(s.substr(0, s.size() - x->size()));
        return self;
    }
    if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
        const int64_t width = int_arg(a, 0, "width", 0);
        const size_t len = text::num_chars(s);
        if (width <= static_cast<int64_t>(len)) return self;
        in.check_string_size(static_cast<size_t>(width) + s.size());
        const size_t pad = static_cast<size_t>(width) - len;
        const std::string* fill = str_arg(a, 1, "fillchar");
        const char f = fill && fill->size() == 1 ? (*fill)[0] : ' ';
        if (name == "zfill") {
            const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
            return Value((sign ? s.substr(0, 1) : "") + std::string(pad, '0') + s.substr(sign ? 1 : 0));
        }
        if (name == "ljust") return Value(s + std::string(pad, f));
        if (name == "rjust") return Value(std::string(pad, f) + s);
        const size_t left = pad / 2 + (pad & len & 1);
        return Value(std::string(left, f) + s + std::string(pad - left, f));
    }
    if (name == "partition" || name == "rpartition") {
        const std::string* sep = str_arg(a, 0, "sep");
        if (!sep || sep->empty()) throw ValueError(name + "() takes a non-empty separator");
        const size_t k = name == "partition" ? s.find(*sep) : s.rfind(*sep);
        if (k == std::string::npos)
            return name == "partition" ? in.new_array({Value(s), Value(""), Value("")})
                                       : in.new_array({Value(""), Value(""), Value(s)});
        return in.new_array({Value(s.substr(0, k)), Value(*sep), Value(s.substr(k + sep->size()))});
    }
    throw ValueError("string has no method '" + name + "'");
}

bool is_string_method(const std::string& n) {
    static const char* const kNames[] = {
        "upper",      "lower",    "casefold", "title",     "capitalize", "strip",        "lstrip",       "rstrip",
        "startswith", "endswith", "split",    "rsplit",    "splitlines", "replace",      "find",         "rfind",
        "index",      "rindex",   "count",    "join",      "format",     "isdigit",      "isnumeric",    "isdecimal",
        "isalpha",    "isalnum",  "isspace",  "isupper",   "islower",    "removeprefix", "removesuffix", "zfill",
        "center",     "ljust",    "rjust",    "partition", "rpartition"};
    for (const char* k : kNames)
        if (n == k) return true;
    return false;
}

// --- list and dict methods -----------------------------------------------------------------------

size_t list_index(int64_t i, size_t size, bool insert) {
    if (i < 0) i += static_cast<int64_t>(size);
    if (insert) return static_cast<size_t>(std::clamp<int64_t>(i, 0, static_cast<int64_t>(size)));
    if (i < 0 || i >= static_cast<int64_t>(size)) throw ValueError("list index out of range");
    return static_cast<size_t>(i);
}

Value list_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
    Array& l = self.as_array();
    if (name == "append") {
        if (a.args.size() != 1) throw ValueError("append() takes exactly one argument");
        in.check_list_size(1);
        l.push_back(a.args[0]);
        in.note_mutation(self);
        return Value::none();
    }
    if (name == "extend") {
        const Array more = as_list(in, arg_or(a, 0, "iterable", Value()));
        in.check_list_size(more.size());
        l.insert(l.end(), more.begin(), more.end());
        in.note_mutation(self);
        return Value::none();
    }
    if (name == "insert") {
        if (a.args.size() != 2) throw ValueError("insert() takes exactly two arguments");
        in.check_list_size(1);
        l.insert(l.begin() + static_cast<ptrdiff_t>(list_index(int_arg(a, 0, "index", 0), l.size(), true)), a.args[1]);
        in.note_mutation(self);
        return Value::none();
    }
    if (name == "pop") {
        if (l.empty()) throw ValueError("pop from empty list");
        const size_t i = list_index(int_arg(a, 0, "index", -1), l.size(), false);
        Value v = l[i];
        l.erase(l.begin() + static_cast<ptrdiff_t>(i));
        return v;
    }
    if (name == "remove") {
        if (a.args.size() != 1) throw ValueError("remove() takes exactly one argument");
        for (auto it = l.begin(); it != l.end(); ++it) {
            if (equals(*it, a.args[0])) {
                l.erase(it);
                return Value::none();
            }
        }
        throw ValueError("list.remove(x): x not in list");
    }
    if (name == "index" || name == "count") {
        if (a.args.empty()) throw ValueError(name + "() takes an argument");
        int64_t n = 0;
        for (size_t i = 0; i < l.size(); ++i) {
            if (!equals(l[i], a.args[0])) continue;
            if (name == "index") return Value(static_cast<int64_t>(i));
            ++n;
        }
        if (name == "index") throw ValueError("value is not in list");
        return Value(n);
    }
    if (name == "reverse") {
        std::reverse(l.begin(), l.end());
        return Value::none();
    }
    if (name == "copy") return in.new_array(l);
    if (name == "clear") {
        l.clear();
        return Value::none();
    }
    throw ValueError("list has no method '" + name + "'");
}

bool is_list_method(const std::string& n) {
    for (const char* k : {"append", "extend", "insert", "pop", "remove", "index", "count", "reverse", "copy", "clear"})
        if (n == k) return true;
    return false;
}

Value items_of(Interpreter& in, const Object& o) {
    Array items;
    items.reserve(o.size());
    for (const auto& [k, v] : o.items()) items.push_back(make_array({Value(k), v}));
    return in.new_array(std::move(items));
}

Value dict_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
    Object& o = self.as_object();
    if (name == "get") {
        const Value* key = a.get(0, "key");
        if (!key) throw ValueError("get() takes at least one argument");
        const Value* v = key->is_string() ? o.find(key->as_string()) : nullptr;
        if (v) return *v;
        const Value* d = a.get(1, "default");
        return d ? *d : Value::none();
    }
    if (name == "items") return items_of(in, o);
    if (name == "keys") {
        Array keys;
        for (const auto& kv : o.items()) keys.emplace_back(kv.first);
        return in.new_array(std::move(keys));
    }
    if (name == "values") {
        Array vals;
        for (const auto& kv : o.items()) vals.push_back(kv.second);
        return in.new_array(std::move(vals));
    }
    if (name == "pop") {
        const Value* key = a.get(0, "key");
        if (!key || !key->is_string()) throw ValueError("pop() takes a string key");
        if (const Value* v = o.find(key->as_string())) {
            Value r = *v;
            o.erase(key->as_string());
            return r;
        }
        if (const Value* d = a.get(1, "default")) return *d;
        throw ValueError("key '" + key->as_string() + "' not found");
    }
    if (name == "setdefault") {
        const Value* key = a.get(0, "key");
        if (!key || !key->is_string()) throw ValueError("setdefault() takes a string key");
        if (const Value* v = o.find(key->as_string())) return *v;
        const Value d = arg_or(a, 1, "default", Value::none());
        o.set(key->as_string(), d);
        in.note_mutation(self);
        return d;
    }
    if (name == "update") {
        if (!a.args.empty()) {
            if (!a.args[0].is_object()) throw ValueError("update() takes a dict");
            const auto items = a.args[0].as_object().items();
            for (const auto& [k, v] : items) o.set(k, v);
        }
        for (const auto& [k, v] : a.kwargs) o.set(k, v);
        in.note_mutation(self);
        return Value::none();
    }
    if (name == "copy") {
        Value c = in.new_object();
        for (const auto& [k, v] : o.items()) c.as_object().set(k, v);
        return c;
    }
    throw ValueError("dict has no method '" + name + "'");
}

bool is_dict_method(const std::string& n) {
    for (const char* k : {"get", "items", "keys", "values", "pop", "setdefault", "update", "copy"})
        if (n == k) return true;
    return false;
}

Value bind_method(const Value& self, const std::string& name) {
    auto f = std::make_shared<Function>();
    f->name = name;
    f->fn = [self, name](Interpreter& in, CallArgs& a) -> Value {
        if (self.is_string()) return string_method(in, self, name, a);
        if (self.is_array()) return list_method(in, self, name, a);
        return dict_method(in, self, name, a);
    };
    return Value(std::move(f));
}

// --- tests ---------------------------------------------------------------------------------------

bool test_arg_compare(const Value& v, const CallArgs& a, const char* op) {
    if (a.args.empty()) throw ValueError(std::string("test '") + op + "' takes an argument");
    const std::string o = op;
    if (o == "eq") return equals(v, a.args[0]);
    if (o == "ne") return !equals(v, a.args[0]);
    const int c = compare(v, a.args[0]);
    return o == "lt" ? c < 0 : o == "le" ? c <= 0 : o == "gt" ? c > 0 : c >= 0;
}

const std::unordered_map<std::string, TestFn>& tests() {
    static const std::unordered_map<std::string, TestFn> m = {
        {"defined", [](Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }},
        {"undefined", [](Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }},
        {"none", [](Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }},
        {"boolean", [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }},
        {"true", [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }},
        {"false", [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }},
        {"integer", [](Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }},
        {"float", [](Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }},
        {"number", [](Interpreter&, const Value& v, CallArgs&) { return v.is_number() || v.is_bool(); }},
        {"string", [](Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }},
        {"mapping", [](Interpreter&, const Value& v, CallArgs&) { return v.is_object(); }},
        {"iterable",
         [](Interpreter&, const Value& v, CallArgs&) { return v.is_array() || v.is_object() || v.is_string(); }},
        {"sequence",
         [](Interpreter&, const Value& v, CallArgs&) { return v.is_array() || v.is_object() || v.is_string(); }},
        {"callable", [](Interpreter&, const Value& v, CallArgs&) { return v.is_function(); }},
        {"escaped", [](Interpreter&, const Value&, CallArgs&) { return false; }},
        {"odd",
         [](Interpreter&, const Value& v, CallArgs&) {
             if (!is_intlike(v)) throw ValueError("test 'odd' needs an integer");
             return int_of(v) % 2 != 0;
         }},
        {"even",
         [](Interpreter&, const Value& v, CallArgs&) {
             if (!is_intlike(v)) throw ValueError("test 'even' needs an integer");
             return int_of(v) % 2 == 0;
         }},
        {"divisibleby",
         [](Interpreter&, const Value& v, CallArgs& a) {
             const int64_t d = int_arg(a, 0, "num", 0);
             if (!is_intlike(v) || d == 0) throw ValueError("test 'divisibleby' needs integers (and a divisor != 0)");
             return d == -1 || int_of(v) % d == 0;
         }},
        {"lower", [](Interpreter&, const Value& v,
                     CallArgs&) { return v.is_string() && !text::has_cased(v.as_string(), true); }},
        {"upper", [](Interpreter&, const Value& v,
                     CallArgs&) { return v.is_string() && !text::has_cased(v.as_string(), false); }},
        {"sameas",
         [](Interpreter&, const Value& v, CallArgs& a) {
             if (a.args.empty()) throw ValueError("test 'sameas' takes an argument");
             const Value& o = a.args[0];
             if (v.type() != o.type()) return false;
             if (v.is_array()) return &v.as_array() == &o.as_array();
             if (v.is_object()) return &v.as_object() == &o.as_object();
             return equals(v, o);
         }},
        {"in",
         [](Interpreter& in, const Value& v, CallArgs& a) {
             if (a.args.empty()) throw ValueError("test 'in' takes an argument");
             const Value& c = a.args[0];
             if (c.is_string()) return v.is_string() && c.as_string().find(v.as_string()) != std::string::npos;
             if (c.is_object()) return v.is_string() && c.as_object().find(v.as_string()) != nullptr;
             for (const Value& e : iterate(in, c))
                 if (equals(e, v)) return true;
             return false;
         }},
        {"eq", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "eq"); }},
        {"equalto", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "eq"); }},
        {"==", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "eq"); }},
        {"ne", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "ne"); }},
        {"!=", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "ne"); }},
        {"lt", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "lt"); }},
        {"lessthan", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "lt"); }},
        {"<", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "lt"); }},
        {"le", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "le"); }},
        {"<=", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "le"); }},
        {"gt", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "gt"); }},
        {"greaterthan", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "gt"); }},
        {">", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "gt"); }},
        {"ge", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "ge"); }},
        {">=", [](Interpreter&, const Value& v, CallArgs& a) { return test_arg_compare(v, a, "ge"); }},
    };
    return m;
}

// select / reject / selectattr / rejectattr: args[skip] names the test, the rest are its arguments.
bool run_item_test(Interpreter& in, const Value& v, const CallArgs& a, size_t skip) {
    if (a.args.size() <= skip) return v.truthy();
    const std::string& name = need_string(a.args[skip], "test name");
    CallArgs targs;
    targs.args.assign(a.args.begin() + static_cast<ptrdiff_t>(skip) + 1, a.args.end());
    return apply_test(in, name, v, targs);
}

// --- filters -------------------------------------------------------------------------------------

Value filter_select(Interpreter& in, const Value& v, CallArgs& a, bool attr, bool keep) {
    Array out;
    const Value* attribute = nullptr;
    if (attr) {
        if (a.args.empty()) throw ValueError("selectattr/rejectattr need an attribute name");
        attribute = &a.args[0];
    }
    for (const Value& item : as_list(in, v)) {
        in.charge(1);
        const Value x = attr ? attr_path(in, item, *attribute) : item;
        if (run_item_test(in, x, a, attr ? 1 : 0) == keep) out.push_back(item);
    }
    return in.new_array(std::move(out));
}

Value filter_map(Interpreter& in, const Value& v, CallArgs& a) {
    Array out;
    if (const Value* attribute = a.kwarg("attribute")) {
        const Value* dflt = a.kwarg("default");
        for (const Value& item : as_list(in, v)) {
            Value x = attr_path(in, item, *attribute);
            out.push_back(x.is_undefined() && dflt ? *dflt : x);
        }
        return in.new_array(std::move(out));
    }
    if (a.args.empty()) throw ValueError("map needs a filter name or attribute=");
    const std::string name = need_string(a.args[0], "map");
    CallArgs fargs;
    fargs.args.assign(a.args.begin() + 1, a.args.end());
    fargs.kwargs = a.kwargs;
    for (const Value& item : as_list(in, v)) {
        CallArgs copy = fargs;
        out.push_back(apply_filter(in, name, item, copy));
    }
    return in.new_array(std::move(out));
}

Value filter_join(Interpreter& in, const Value& v, CallArgs& a) {
    const std::string* sep = str_arg(a, 0, "d");
    const Value* attribute = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : as_list(in, v)) {
        if (!first && sep) out += *sep;
        first = false;
        out += to_str(attribute ? attr_path(in, item, *attribute) : item, in.limits().max_output_bytes);
        in.check_string_size(out.size());
    }
    return Value(std::move(out));
}

Value filter_sort(Interpreter& in, const Value& v, CallArgs& a) {
    const bool reverse = bool_arg(a, 0, "reverse", false);
    const bool cs = bool_arg(a, 1, "case_sensitive", false);
    const Value* attribute = a.get(2, "attribute");
    Array items = as_list(in, v);
    std::vector<std::pair<Value, Value>> keyed;
    for (Value& item : items) {
        Value k = sort_key(attribute ? attr_path(in, item, *attribute) : item, cs);
        keyed.emplace_back(std::move(k), std::move(item));
    }
    in.charge(keyed.size() * 4);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
    });
    Array out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return in.new_array(std::move(out));
}

Value filter_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
    if (!v.is_object()) throw ValueError("dictsort expects a dict, got " + std::string(v.type_name()));
    const bool cs = bool_arg(a, 0, "case_sensitive", false);
    const std::string* by = str_arg(a, 1, "by");
    const bool by_value = by && *by == "value";
    if (by && !by_value && *by != "key") throw ValueError("dictsort: 'by' must be 'key' or 'value'");
    const bool reverse = bool_arg(a, 2, "reverse", false);
    std::vector<std::pair<std::string, Value>> items(v.as_object().items().begin(), v.as_object().items().end());
    in.charge(items.size() * 4);
    std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
        const Value kx = sort_key(by_value ? x.second : Value(x.first), cs);
        const Value ky = sort_key(by_value ? y.second : Value(y.first), cs);
        return reverse ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
    });
    Array out;
    for (auto& [k, val] : items) out.push_back(make_array({Value(k), val}));
    return in.new_array(std::move(out));
}

Value filter_unique(Interpreter& in, const Value& v, CallArgs& a) {
    const bool cs = bool_arg(a, 0, "case_sensitive", false);
    const Value* attribute = a.get(1, "attribute");
    Array out, seen;
    for (const Value& item : as_list(in, v)) {
        const Value k = sort_key(attribute ? attr_path(in, item, *attribute) : item, cs);
        in.charge(seen.size() / 16 + 1);
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) continue;
        seen.push_back(k);
        out.push_back(item);
    }
    return in.new_array(std::move(out));
}

Value filter_minmax(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
    const bool cs = bool_arg(a, 0, "case_sensitive", false);
    const Value* attribute = a.get(1, "attribute");
    const Array items = as_list(in, v);
    if (items.empty()) return Value();
    size_t best = 0;
    Value best_key = sort_key(attribute ? attr_path(in, items[0], *attribute) : items[0], cs);
    for (size_t i = 1; i < items.size(); ++i) {
        Value k = sort_key(attribute ? attr_path(in, items[i], *attribute) : items[i], cs);
        const int c = compare(k, best_key);
        if (want_max ? c > 0 : c < 0) {
            best = i;
            best_key = std::move(k);
        }
    }
    return items[best];
}

Value filter_indent(Interpreter& in, const Value& v, CallArgs& a) {
    const std::string s = to_str(v, in.limits().max_output_bytes);
    std::string pad;
    const Value* w = a.get(0, "width");
    if (w && w->is_string()) {
        pad = w->as_string();
    } else {
        const int64_t n = int_arg(a, 0, "width", 4);
        if (n > 0) {
            in.check_string_size(static_cast<size_t>(n));
            pad.assign(static_cast<size_t>(n), ' ');
        }
    }
    const bool first = bool_arg(a, 1, "first", false);
    const bool blank = bool_arg(a, 2, "blank", false);
    // Jinja: lines of s + "\n" (a trailing newline survives); the first line and blank ones stay as they are
    std::vector<std::string_view> lines;
    const std::string t = s + "\n";
    size_t start = 0;
    for (size_t k = t.find('\n'); k != std::string::npos; k = t.find('\n', start)) {
        lines.push_back(std::string_view(t).substr(start, k - start));
        start = k + 1;
    }
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
        if (i) out += '\n';
        const bool indent = (i == 0) ? first : (blank || !lines[i].empty());
        if (indent) out += pad;
        out += lines[i];
        in.check_string_size(out.size());
    }
    return Value(std::move(out));
}

Value filter_tojson(Interpreter& in, const Value& v, CallArgs& a) {
    JsonOptions o;
    const Value* indent = a.get(0, "indent");
    if (indent && is_intlike(*indent)) o.indent = static_cast<int>(std::clamp<int64_t>(int_of(*indent), -1, 1 << 20));
    if (indent && indent->is_string()) throw ValueError("tojson: a string indent is not supported");
    o.ensure_ascii = bool_arg(a, 1, "ensure_ascii", false);
    if (const Value* seps = a.kwarg("separators"); seps && seps->is_array()) {
        if (seps->as_array().size() != 2) throw ValueError("tojson: separators must be two strings");
        o.item_sep = need_string(seps->as_array()[0], "separators");
        o.key_sep = need_string(seps->as_array()[1], "separators");
    }
    o.sort_keys = bool_arg(a, 99, "sort_keys", false);
    o.max_bytes = in.limits().max_output_bytes;
    std::string s = to_json(v, o);
    in.check_string_size(s.size());
    return Value(std::move(s));
}

Value filter_round(Interpreter&, const Value& v, CallArgs& a) {
    if (!v.is_number() && !v.is_bool()) throw ValueError("round expects a number");
    const int64_t precision = std::clamp<int64_t>(int_arg(a, 0, "precision", 0), -300, 300);
    const std::string* method = str_arg(a, 1, "method");
    const double x = v.is_bool() ? double(v.as_bool()) : v.as_number();
    const double scale = std::pow(10.0, static_cast<double>(precision));
    double r;
    if (!method || *method == "common") {
        if (is_intlike(v) && precision >= 0) return Value(int_of(v));  // Python round(int, n) is the int
        r = std::nearbyint(x * scale) / scale;                         // Python round(): half to even
    } else if (*method == "ceil") {
        r = std::ceil(x * scale) / scale;
    } else if (*method == "floor") {
        r = std::floor(x * scale) / scale;
    } else {
        throw ValueError("round: method must be common, ceil or floor");
    }
    return Value(r);
}

Value filter_batch(Interpreter& in, const Value& v, CallArgs& a) {
    const int64_t n = int_arg(a, 0, "linecount", 0);
    if (n <= 0) throw ValueError("batch: the size must be positive");
    const Value* fill = a.get(1, "fill_with");
    Array out, cur;
    for (const Value& item : as_list(in, v)) {
        cur.push_back(item);
        if (static_cast<int64_t>(cur.size()) == n) out.push_back(in.new_array(std::exchange(cur, {})));
    }
    if (!cur.empty()) {
        if (fill && !fill->is_none())
            while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
        out.push_back(in.new_array(std::move(cur)));
    }
    return in.new_array(std::move(out));
}

Value filter_int(Interpreter&, const Value& v, CallArgs& a) {
    const Value dflt = arg_or(a, 0, "default", Value(int64_t{0}));
    if (is_intlike(v)) return Value(int_of(v));
    if (v.is_float()) {
        const double f = v.as_float();
        if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return dflt;
        return Value(static_cast<int64_t>(f));
    }
    if (v.is_string()) {
        const std::string_view s = text::strip(v.as_string(), nullptr, true, true);
        const int64_t base = int_arg(a, 1, "base", 10);
        if (s.empty() || base < 2 || base > 36) return dflt;
        std::string tmp(s);
        tmp.erase(std::remove(tmp.begin(), tmp.end(), '_'), tmp.end());
        char* end = nullptr;
        errno = 0;
        const long long r = std::strtoll(tmp.c_str(), &end, static_cast<int>(base));
        if (end && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(r));
        const double f = std::strtod(tmp.c_str(), &end);  // Jinja: int("3.5") -> 3
        if (end && *end == '\0' && std::isfinite(f) && std::fabs(f) < 9.2e18) return Value(static_cast<int64_t>(f));
        return dflt;
    }
    return dflt;
}

Value filter_float(Interpreter&, const Value& v, CallArgs& a) {
    const Value dflt = arg_or(a, 0, "default", Value(0.0));
    if (v.is_number() || v.is_bool()) return Value(v.is_bool() ? double(v.as_bool()) : v.as_number());
    if (v.is_string()) {
        const std::string s(text::strip(v.as_string(), nullptr, true, true));
        char* end = nullptr;
        const double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value(f);
    }
    return dflt;
}

Value filter_escape(Interpreter& in, const Value& v, CallArgs&) {
    std::string out;
    for (char c : to_str(v, in.limits().max_output_bytes)) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return str_value(in, std::move(out));
}

Value filter_first_last(Interpreter& in, const Value& v, bool first) {
    if (v.is_string()) {
        const auto cs = text::chars(v.as_string());
        if (cs.empty()) return Value();
        return Value(first ? cs.front() : cs.back());
    }
    const Array items = as_list(in, v);
    if (items.empty()) return Value();
    return first ? items.front() : items.back();
}

Value filter_sum(Interpreter& in, const Value& v, CallArgs& a) {
    const Value* attribute = a.get(0, "attribute");
    Value total = arg_or(a, 1, "start", Value(int64_t{0}));
    for (const Value& item : as_list(in, v)) {
        const Value x = attribute ? attr_path(in, item, *attribute) : item;
        if (is_intlike(total) && is_intlike(x)) {
            int64_t r;
            if (__builtin_add_overflow(int_of(total), int_of(x), &r)) throw ValueError("integer overflow");
            total = Value(r);
        } else if ((total.is_number() || total.is_bool()) && (x.is_number() || x.is_bool())) {
            total = Value((total.is_bool() ? double(total.as_bool()) : total.as_number()) +
                          (x.is_bool() ? double(x.as_bool()) : x.as_number()));
        } else {
            throw ValueError("sum: unsupported operand types");
        }
    }
    return total;
}

Value filter_wordcount(Interpreter& in, const Value& v, CallArgs&) {
    const std::string s = to_str(v, in.limits().max_output_bytes);
    int64_t n = 0;
    bool in_word = false;
    for (char c : s) {
        const bool w = ascii_alnum(c) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
        if (w && !in_word) ++n;
        in_word = w;
    }
    return Value(n);
}

Value filter_reverse(Interpreter& in, const Value& v, CallArgs&) {
    if (v.is_string()) {
        auto cs = text::chars(v.as_string());
        std::string out;
        for (auto it = cs.rbegin(); it != cs.rend(); ++it) out.append(*it);
        return Value(std::move(out));
    }
    Array items = as_list(in, v);
    std::reverse(items.begin(), items.end());
    return in.new_array(std::move(items));
}

Value filter_from_json(Interpreter& in, const Value& v, CallArgs&) {
    const std::string& s = need_string(v, "from_json");
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(s, nullptr, false);
    if (j.is_discarded()) throw ValueError("from_json: the string is not valid JSON");
    in.check_list_size(s.size() / 8);
    return from_json(j);
}

const std::unordered_map<std::string, FilterFn>& filters() {
    static const std::unordered_map<std::string, FilterFn> m = {
        {"safe", [](Interpreter&, const Value& v, CallArgs&) { return v; }},
        {"string",
         [](Interpreter& in, const Value& v, CallArgs&) {
             return v.is_string() ? v : str_value(in, to_str(v, in.limits().max_output_bytes));
         }},
        {"tojson", filter_tojson},
        {"length", [](Interpreter&, const Value& v, CallArgs&) { return Value(static_cast<int64_t>(length_of(v))); }},
        {"count", [](Interpreter&, const Value& v, CallArgs&) { return Value(static_cast<int64_t>(length_of(v))); }},
        {"trim",
         [](Interpreter& in, const Value& v, CallArgs& a) {
             const std::string s = to_str(v, in.limits().max_output_bytes);
             return Value(text::strip(s, str_arg(a, 0, "chars"), true, true));
         }},
        {"upper", [](Interpreter& in, const Value& v,
                     CallArgs&) { return Value(text::upper(to_str(v, in.limits().max_output_bytes))); }},
        {"lower", [](Interpreter& in, const Value& v,
                     CallArgs&) { return Value(text::lower(to_str(v, in.limits().max_output_bytes))); }},
        {"capitalize", [](Interpreter& in, const Value& v,
                          CallArgs&) { return Value(text::capitalize(to_str(v, in.limits().max_output_bytes))); }},
        {"title", [](Interpreter& in, const Value& v,
                     CallArgs&) { return Value(text::jinja_title(to_str(v, in.limits().max_output_bytes))); }},
        {"replace",
         [](Interpreter& in, const Value& v, CallArgs& a) {
             const Value s(to_str(v, in.limits().max_output_bytes));
             return string_method(in, s, "replace", a);
         }},
        {"default",
         [](Interpreter&, const Value& v, CallArgs& a) {
             const Value dflt = arg_or(a, 0, "default_value", Value(""));
             const bool boolean = bool_arg(a, 1, "boolean", false);
             return v.is_undefined() || (boolean && !v.truthy()) ? dflt : v;
         }},
        {"d",
         [](Interpreter&, const Value& v, CallArgs& a) {
             const Value dflt = arg_or(a, 0, "default_value", Value(""));
             const bool boolean = bool_arg(a, 1, "boolean", false);
             return v.is_undefined() || (boolean && !v.truthy()) ? dflt : v;
         }},
        {"first", [](Interpreter& in, const Value& v, CallArgs&) { return filter_first_last(in, v, true); }},
        {"last", [](Interpreter& in, const Value& v, CallArgs&) { return filter_first_last(in, v, false); }},
        {"list", [](Interpreter& in, const Value& v, CallArgs&) { return in.new_array(as_list(in, v)); }},
        {"items",
         [](Interpreter& in, const Value& v, CallArgs&) {
             if (v.is_undefined()) return in.new_array();
             if (!v.is_object()) throw ValueError("items expects a dict, got " + std::string(v.type_name()));
             return items_of(in, v.as_object());
         }},
        {"join", filter_join},
        {"map", filter_map},
        {"select", [](Interpreter& in, const Value& v, CallArgs& a) { return filter_select(in, v, a, false, true); }},
        {"reject", [](Interpreter& in, const Value& v, CallArgs& a) { return filter_select(in, v, a, false, false); }},
        {"selectattr",
         [](Interpreter& in, const Value& v, CallArgs& a) { return filter_select(in, v, a, true, true); }},
        {"rejectattr",
         [](Interpreter& in, const Value& v, CallArgs& a) { return filter_select(in, v, a, true, false); }},
        {"sort", filter_sort},
        {"dictsort", filter_dictsort},
        {"unique", filter_unique},
        {"min", [](Interpreter& in, const Value& v, CallArgs& a) { return filter_minmax(in, v, a, false); }},
        {"max", [](Interpreter& in, const Value& v, CallArgs& a) { return filter_minmax(in, v, a, true); }},
        {"sum", filter_sum},
        {"reverse", filter_reverse},
        {"indent", filter_indent},
        {"int", filter_int},
        {"float", filter_float},
        {"bool", [](Interpreter&, const Value& v, CallArgs&) { return Value(v.truthy()); }},
        {"abs",
         [](Interpreter&, const Value& v, CallArgs&) {
             if (v.is_float()) return Value(std::fabs(v.as_float()));
             if (!is_intlike(v)) throw ValueError("abs expects a number, got " + std::string(v.type_name()));
             if (int_of(v) == INT64_MIN) throw ValueError("integer overflow");
             return Value(int_of(v) < 0 ? -int_of(v) : int_of(v));
         }},
        {"round", filter_round},
        {"batch", filter_batch},
        {"wordcount", filter_wordcount},
        {"escape", filter_escape},
        {"e", filter_escape},
        {"forceescape", filter_escape},
        {"attr",
         [](Interpreter& in, const Value& v, CallArgs& a) {
             const std::string* name = str_arg(a, 0, "name");
             if (!name) throw ValueError("attr takes an attribute name");
             return get_attr(in, v, *name);
         }},
        {"format",
         [](Interpreter& in, const Value& v, CallArgs& a) {
             return str_value(in, percent_format(need_string(v, "format"), a.args, in.limits().max_output_bytes));
         }},
        {"center",
         [](Interpreter& in, const Value& v, CallArgs& a) {
             CallArgs b;
             b.args.push_back(Value(int_arg(a, 0, "width", 80)));
             return string_method(in, Value(to_str(v, in.limits().max_output_bytes)), "center", b);
         }},
        {"from_json", filter_from_json},
    };
    return m;
}

const std::unordered_map<std::string, Value>& globals() {
    static const std::unordered_map<std::string, Value> m = [] {
        std::unordered_map<std::string, Value> g;
        auto def = [&](const std::string& name, std::function<Value(Interpreter&, CallArgs&)> fn) {
            auto f = std::make_shared<Function>();
            f->name = name;
            f->fn = std::move(fn);
            g.emplace(name, Value(std::move(f)));
        };
        def("raise_exception", [](Interpreter& in, CallArgs& a) -> Value {
            const Value msg = a.args.empty() ? Value("") : a.args[0];
            throw RaisedError(to_str(msg, in.limits().max_output_bytes));
        });
        def("range", [](Interpreter& in, CallArgs& a) -> Value {
            for (const Value& v : a.args)
                if (!is_intlike(v)) throw ValueError("range() takes integers, not " + std::string(v.type_name()));
            int64_t start = 0, stop = 0, step = 1;
            if (a.args.size() == 1) {
                stop = int_of(a.args[0]);
            } else if (a.args.size() == 2 || a.args.size() == 3) {
                start = int_of(a.args[0]);
                stop = int_of(a.args[1]);
                if (a.args.size() == 3) step = int_of(a.args[2]);
            } else {
                throw ValueError("range() takes 1 to 3 arguments");
            }
            if (step == 0) throw ValueError("range() step must not be zero");
            // the count first, in 128 bits, so that range(10**18) fails before it allocates
            const __int128 span = step > 0 ? (__int128)stop - start : (__int128)start - stop;
            const __int128 abs_step = step > 0 ? step : -(__int128)step;
            const __int128 n = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
            if (n > static_cast<__int128>(in.limits().max_work))
                in.check_list_size(static_cast<size_t>(in.limits().max_work) + 1);
            in.check_list_size(static_cast<size_t>(n));
            Array items;
            items.reserve(static_cast<size_t>(n));
            for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) items.emplace_back(start + i * step);
            return make_array(std::move(items));
        });
        def("namespace", [](Interpreter& in, CallArgs& a) -> Value {
            Value ns = in.new_object();
            for (const Value& v : a.args) {
                if (!v.is_object()) throw ValueError("namespace() takes keyword arguments or a dict");
                for (const auto& [k, x] : v.as_object().items()) ns.as_object().set(k, x);
            }
            for (const auto& [k, v] : a.kwargs) ns.as_object().set(k, v);
            return ns;
        });
        def("dict", [](Interpreter& in, CallArgs& a) -> Value {
            Value d = in.new_object();
            for (const Value& v : a.args) {
                if (!v.is_object()) throw ValueError("dict() takes keyword arguments or a dict");
                for (const auto& [k, x] : v.as_object().items()) d.as_object().set(k, x);
            }
            for (const auto& [k, v] : a.kwargs) d.as_object().set(k, v);
            return d;
        });
        return g;
    }();
    return m;
}

}  // namespace

std::string percent_format(const std::string& fmt, const Array& args, size_t max_bytes) {
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out += fmt[i];
            continue;
        }
        if (++i >= fmt.size()) throw ValueError("incomplete format");
        const char c = fmt[i];
        if (c == '%') {
            out += '%';
            continue;
        }
        if (next >= args.size()) throw ValueError("not enough arguments for format string");
        const Value& a = args[next++];
        switch (c) {
            case 's':
                out += to_str(a, max_bytes);
                break;
            case 'r':
                out += repr(a, max_bytes);
                break;
            case 'd':
            case 'i':
                if (!a.is_number() && !a.is_bool()) throw ValueError("%d format: a number is required");
                if (a.is_float()) {  // Python: the float truncated, however large; inf / nan are errors
                    const double f = std::trunc(a.as_float());
                    if (!std::isfinite(f))
                        throw ValueError("%d format: cannot convert " + to_str(a, 64) + " to integer");
                    char buf[400];  // the largest double has 309 digits
                    std::snprintf(buf, sizeof buf, "%.0f", f);
                    out += buf;
                } else {
                    out += std::to_string(int_of(a));
                }
                break;
            case 'f': {
                if (!a.is_number() && !a.is_bool()) throw ValueError("%f format: a number is required");
                char buf[64];
                std::snprintf(buf, sizeof buf, "%f", a.is_bool() ? double(a.as_bool()) : a.as_number());
                out += buf;
                break;
            }
            default:
                throw ValueError(std::string("unsupported format character '") + c + "'");
        }
        if (out.size() > max_bytes) throw ValueError("formatted string too long");
    }
    if (next < args.size()) throw ValueError("not all arguments converted during string formatting");
    return out;
}

// --- entry points ----------------------------------------------------------------------------------

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
    const auto& m = filters();
    auto it = m.find(name);
    if (it == m.end()) throw ValueError("unknown filter '" + name + "'");
    in.charge(1);
    return it->second(in, v, args);
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
    const auto& m = tests();
    auto it = m.find(name);
    if (it == m.end()) throw ValueError("unknown test '" + name + "'");
    in.charge(1);
    return it->second(in, v, args);
}

const Value* builtin_global(const std::string& name) {
    const auto& g = globals();
    auto it = g.find(name);
    return it == g.end() ? nullptr : &it->second;
}

Value get_attr(Interpreter& in, const Value& obj, const std::string& name) {
    (void)in;
    if (obj.is_object()) {
        if (const Value* v = obj.as_object().find(name)) return *v;
        if (is_dict_method(name)) return bind_method(obj, name);
        return Value();
    }
    if (obj.is_string() && is_string_method(name)) return bind_method(obj, name);
    if (obj.is_array() && is_list_method(name)) return bind_method(obj, name);
    return Value();
}

Value get_item(Interpreter& in, const Value& obj, const Value& key) {
    if (obj.is_object()) {
        if (key.is_string()) {
            if (const Value* v = obj.as_object().find(key.as_string())) return *v;
            return Value();
        }
        return Value();
    }
    if (obj.is_array() || obj.is_string()) {
        if (key.is_string()) return get_attr(in, obj, key.as_string());
        if (!is_intlike(key)) return Value();
        int64_t i = int_of(key);
        if (obj.is_array()) {
            const Array& a = obj.as_array();
            if (i < 0) i += static_cast<int64_t>(a.size());
            if (i < 0 || i >= static_cast<int64_t>(a.size())) return Value();
            return a[static_cast<size_t>(i)];
        }
        const std::string& s = obj.as_string();
        if (text::is_ascii(s)) {
            if (i < 0) i += static_cast<int64_t>(s.size());
            if (i < 0 || i >= static_cast<int64_t>(s.size())) return Value();
            return Value(s.substr(static_cast<size_t>(i), 1));
        }
        const auto cs = text::chars(s);
        if (i < 0) i += static_cast<int64_t>(cs.size());
        if (i < 0 || i >= static_cast<int64_t>(cs.size())) return Value();
        return Value(cs[static_cast<size_t>(i)]);
    }
    return Value();
}

Value slice(Interpreter& in, const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
    auto opt_int = [](const Value& v, const char* what) -> std::optional<int64_t> {
        if (v.is_undefined() || v.is_none()) return std::nullopt;
        if (!is_intlike(v)) throw ValueError(std::string("slice ") + what + " must be an integer");
        return int_of(v);
    };
    const auto start_o = opt_int(start_v, "start"), stop_o = opt_int(stop_v, "stop");
    const int64_t step = opt_int(step_v, "step").value_or(1);
    if (step == 0) throw ValueError("slice step cannot be zero");
    if (obj.is_undefined()) return Value();
    std::vector<std::string_view> cs;
    int64_t n;
    if (obj.is_array()) {
        n = static_cast<int64_t>(obj.as_array().size());
    } else if (obj.is_string()) {
        cs = text::chars(obj.as_string());
        n = static_cast<int64_t>(cs.size());
    } else {
        throw ValueError(std::string(obj.type_name()) + " cannot be sliced");
    }
    // Python's slice.indices()
    auto clamp_index = [&](std::optional<int64_t> v, int64_t dflt_pos, int64_t dflt_neg) -> int64_t {
        if (!v) return step > 0 ? dflt_pos : dflt_neg;
        int64_t i = *v;
        if (i < 0) {
            i += n;
            if (i < 0) i = step > 0 ? 0 : -1;
        } else if (i >= n) {
            i = step > 0 ? n : n - 1;
        }
        return i;
    };
    const int64_t start = clamp_index(start_o, 0, n - 1);
    const int64_t stop = clamp_index(stop_o, n, -1);
    std::vector<int64_t> idx;
    if (step > 0)
        for (int64_t i = start; i < stop; i += step) idx.push_back(i);
    else
        for (int64_t i = start; i > stop; i += step) idx.push_back(i);
    in.charge(idx.size());
    if (obj.is_array()) {
        Array out;
        out.reserve(idx.size());
        for (int64_t i : idx) out.push_back(obj.as_array()[static_cast<size_t>(i)]);
        return make_array(std::move(out));
    }
    std::string out;
    for (int64_t i : idx) out.append(cs[static_cast<size_t>(i)]);
    return Value(std::move(out));
}

Array iterate(Interpreter& in, const Value& v) {
    switch (v.type()) {
        case Value::Type::Undefined:
            return {};
        case Value::Type::Array:
            return v.as_array();
        case Value::Type::Object: {
            Array keys;
            keys.reserve(v.as_object().size());
            for (const auto& kv : v.as_object().items()) keys.emplace_back(kv.first);
            return keys;
        }
        case Value::Type::String: {
            Array out;
            for (std::string_view c : text::chars(v.as_string())) out.emplace_back(c);
            in.charge(out.size());
            return out;
        }
        default:
            throw ValueError(std::string(v.type_name()) + " is not iterable");
    }
}

size_t length_of(const Value& v) {
    switch (v.type()) {
        case Value::Type::Undefined:
            return 0;
        case Value::Type::String:
            return text::num_chars(v.as_string());
        case Value::Type::Array:
            return v.as_array().size();
        case Value::Type::Object:
            return v.as_object().size();
        default:
            throw ValueError(std::string(v.type_name()) + " has no length");
    }
}

}  // namespace peregrine::jinja
