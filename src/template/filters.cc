// The Jinja filters (`x | name(args)`), as Jinja2's, and the table apply_filter looks them up in.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>

#include "template/builtins_internal.h"
#include "template/text.h"

namespace peregrine::jinja::builtin {

namespace {

// select / reject / selectattr / rejectattr: args[skip] names the test, the rest are its arguments.
bool run_item_test(Interpreter& in, const Value& v, const CallArgs& a, size_t skip) {
    if (a.args.size() <= skip) return v.truthy();
    const std::string& name = need_string(a.args[skip], "test name");
    CallArgs targs;
    targs.args.assign(a.args.begin() + static_cast<ptrdiff_t>(skip) + 1, a.args.end());
    return apply_test(in, name, v, targs);
}

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

}  // namespace

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

}  // namespace peregrine::jinja::builtin
