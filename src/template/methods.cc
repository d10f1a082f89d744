// Methods of str, list and dict values ("a".upper(), xs.append(x), d.items()), as Python's.
#include <algorithm>

#include "template/builtins_internal.h"
#include "template/text.h"

namespace peregrine::jinja::builtin {

namespace {

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

size_t list_index(int64_t i, size_t size, bool insert) {
    if (i < 0) i += static_cast<int64_t>(size);
    if (insert) return static_cast<size_t>(std::clamp<int64_t>(i, 0, static_cast<int64_t>(size)));
    if (i < 0 || i >= static_cast<int64_t>(size)) throw ValueError("list index out of range");
    return static_cast<size_t>(i);
}

}  // namespace

// --- string methods ---------------------------------------------------------------------------------

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

}  // namespace peregrine::jinja::builtin
