// Tests (`x is name`), the global functions, %-formatting, and the interpreter's entry points
// into the builtins: apply_filter / apply_test, attribute and item access, slicing, iteration.
// Methods of str / list / dict are in methods.cc, filters in filters.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <unordered_map>

#include "template/builtins_internal.h"
#include "template/interpreter.h"
#include "template/text.h"

namespace peregrine::jinja {

using namespace builtin;  // builtins_internal.h: argument helpers, methods, filters

namespace {

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
