#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <type_traits>

namespace peregrine::jinja {

namespace {

constexpr size_t kIndexThreshold = 12;  // dicts with more keys than this get a hash index

void check_depth(int depth) {
    if (depth > kMaxValueDepth) throw ValueError("value nested too deeply (a list or dict that contains itself?)");
}

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i. An invalid byte
// decodes as itself (U+0080..U+00FF range is not produced: the byte is returned with `valid` false).
uint32_t next_code_point(std::string_view s, size_t& i, bool& valid) {
    const auto c = static_cast<unsigned char>(s[i]);
    valid = true;
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
        valid = false;
        ++i;
        return c;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
        const auto cc = static_cast<unsigned char>(s[i + k]);
        if ((cc & 0xC0) != 0x80) {
            valid = false;
            ++i;
            return c;
        }
        cp = (cp << 6) | (cc & 0x3F);
    }
    i += len;
    return cp;
}

void hex_escape(std::string& out, const char* prefix, uint32_t v, int digits) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%s%0*x", prefix, digits, v);
    out += buf;
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
    out += '"';
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x80) {
            if (!ensure_ascii) {
                out += static_cast<char>(c);
                ++i;
                continue;
            }
            bool valid = true;
            uint32_t cp = next_code_point(s, i, valid);
            if (!valid) cp = 0xFFFD;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                hex_escape(out, "\\u", 0xD800 + (cp >> 10), 4);
                hex_escape(out, "\\u", 0xDC00 + (cp & 0x3FF), 4);
            } else {
                hex_escape(out, "\\u", cp, 4);
            }
            continue;
        }
        ++i;
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20)
                    hex_escape(out, "\\u", c, 4);
                else
                    out += static_cast<char>(c);
        }
    }
    out += '"';
}

void repr_string(std::string& out, std::string_view s) {
    const bool has_single = s.find('\'') != std::string_view::npos;
    const bool has_double = s.find('"') != std::string_view::npos;
    const char q = has_single && !has_double ? '"' : '\'';
    out += q;
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x80) {
            const size_t start = i;
            bool valid = true;
            const uint32_t cp = next_code_point(s, i, valid);
            if (!valid || (cp >= 0x80 && cp < 0xA0))
                hex_escape(out, "\\x", valid ? cp : c, 2);
            else
                out.append(s.substr(start, i - start));
            continue;
        }
        ++i;
        if (c == static_cast<unsigned char>(q) || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            hex_escape(out, "\\x", c, 2);
        } else {
            out += static_cast<char>(c);
        }
    }
    out += q;
}

void str_into(std::string& out, const Value& v, bool quote_strings, int depth, size_t max_bytes);

void check_bytes(const std::string& out, size_t max_bytes) {
    if (out.size() > max_bytes)
        throw ValueError("text longer than the limit of " + std::to_string(max_bytes) + " bytes");
}

void container_str(std::string& out, const Value& v, int depth, size_t max_bytes) {
    check_depth(depth);
    if (v.is_array()) {
        out += '[';
        bool first = true;
        for (const Value& e : v.as_array()) {
            if (!first) out += ", ";
            first = false;
            str_into(out, e, true, depth + 1, max_bytes);
            check_bytes(out, max_bytes);
        }
        out += ']';
    } else {
        out += '{';
        bool first = true;
        for (const auto& [k, e] : v.as_object().items()) {
            if (!first) out += ", ";
            first = false;
            repr_string(out, k);
            out += ": ";
            str_into(out, e, true, depth + 1, max_bytes);
            check_bytes(out, max_bytes);
        }
        out += '}';
    }
}

void str_into(std::string& out, const Value& v, bool quote_strings, int depth, size_t max_bytes) {
    switch (v.type()) {
        case Value::Type::Undefined:
            break;
        case Value::Type::None:
            out += "None";
            break;
        case Value::Type::Bool:
            out += v.as_bool() ? "True" : "False";
            break;
        case Value::Type::Int:
            out += std::to_string(v.as_int());
            break;
        case Value::Type::Float:
            out += format_float(v.as_float());
            break;
        case Value::Type::String:
            if (quote_strings)
                repr_string(out, v.as_string());
            else
                out += v.as_string();
            break;
        case Value::Type::Array:
        case Value::Type::Object:
            container_str(out, v, depth, max_bytes);
            break;
        case Value::Type::Function:
            out += "<function ";
            out += v.as_function().name;
            out += '>';
            break;
    }
}

void json_into(std::string& out, const Value& v, const JsonOptions& o, int depth) {
    check_depth(depth);
    const std::string& item_sep = o.item_sep;
    const std::string& key_sep = o.key_sep;
    auto newline = [&](int level) {
        if (out.size() + static_cast<size_t>(o.indent) * level >= o.max_bytes)
            throw ValueError("text longer than the limit of " + std::to_string(o.max_bytes) + " bytes");
        out += '\n';
        out.append(static_cast<size_t>(o.indent) * level, ' ');
    };
    switch (v.type()) {
        case Value::Type::Undefined:
        case Value::Type::None:
            out += "null";
            break;
        case Value::Type::Bool:
            out += v.as_bool() ? "true" : "false";
            break;
        case Value::Type::Int:
            out += std::to_string(v.as_int());
            break;
        case Value::Type::Float: {
            const double f = v.as_float();
            if (std::isnan(f))
                out += "NaN";
            else if (std::isinf(f))
                out += f > 0 ? "Infinity" : "-Infinity";
            else
                out += format_float(f);
            break;
        }
        case Value::Type::String:
            json_string(out, v.as_string(), o.ensure_ascii);
            break;
        case Value::Type::Array: {
            const Array& a = v.as_array();
            if (a.empty()) {
                out += "[]";
                break;
            }
            out += '[';
            for (size_t i = 0; i < a.size(); ++i) {
                if (i) out += item_sep;
                if (o.indent >= 0) newline(depth + 1);
                json_into(out, a[i], o, depth + 1);
                check_bytes(out, o.max_bytes);
            }
            if (o.indent >= 0) newline(depth);
            out += ']';
            break;
        }
        case Value::Type::Object: {
            const auto& items = v.as_object().items();
            if (items.empty()) {
                out += "{}";
                break;
            }
            std::vector<const std::pair<std::string, Value>*> order;
            order.reserve(items.size());
            for (const auto& kv : items) order.push_back(&kv);
            if (o.sort_keys)
                std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
            out += '{';
            for (size_t i = 0; i < order.size(); ++i) {
                if (i) out += item_sep;
                if (o.indent >= 0) newline(depth + 1);
                json_string(out, order[i]->first, o.ensure_ascii);
                out += key_sep;
                json_into(out, order[i]->second, o, depth + 1);
                check_bytes(out, o.max_bytes);
            }
            if (o.indent >= 0) newline(depth);
            out += '}';
            break;
        }
        case Value::Type::Function:
            throw ValueError("Object of type function is not JSON serializable");
    }
}

bool equals_at(const Value& a, const Value& b, int depth) {
    check_depth(depth);
    if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
        if (a.is_float() || b.is_float()) {
            auto num = [](const Value& v) { return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number(); };
            return num(a) == num(b);
        }
        auto num = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
        return num(a) == num(b);
    }
    if (a.type() != b.type()) return false;
    switch (a.type()) {
        case Value::Type::Undefined:
        case Value::Type::None:
            return true;
        case Value::Type::String:
            return a.as_string() == b.as_string();
        case Value::Type::Array: {
            const Array &x = a.as_array(), &y = b.as_array();
            if (&x == &y) return true;
            if (x.size() != y.size()) return false;
            for (size_t i = 0; i < x.size(); ++i)
                if (!equals_at(x[i], y[i], depth + 1)) return false;
            return true;
        }
        case Value::Type::Object: {
            const Object &x = a.as_object(), &y = b.as_object();
            if (&x == &y) return true;
            if (x.size() != y.size()) return false;
            for (const auto& [k, v] : x.items()) {
                const Value* w = y.find(k);
                if (!w || !equals_at(v, *w, depth + 1)) return false;
            }
            return true;
        }
        case Value::Type::Function:
            return &a.as_function() == &b.as_function();
        default:
            return false;
    }
}

int compare_at(const Value& a, const Value& b, int depth) {
    check_depth(depth);
    if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
        if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
        auto num = [](const Value& v) { return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number(); };
        const double x = num(a), y = num(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
        const int c = a.as_string().compare(b.as_string());
        return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.is_array() && b.is_array()) {
        const Array &x = a.as_array(), &y = b.as_array();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (equals_at(x[i], y[i], depth + 1)) continue;
            return compare_at(x[i], y[i], depth + 1);
        }
        return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    throw ValueError(std::string("'<' not supported between ") + std::string(a.type_name()) + " and " +
                     std::string(b.type_name()));
}

}  // namespace

// --- CallArgs ---------------------------------------------------------------------------------

const Value* CallArgs::kwarg(std::string_view name) const {
    for (const auto& [k, v] : kwargs)
        if (k == name) return &v;
    return nullptr;
}

const Value* CallArgs::get(size_t pos, std::string_view name) const {
    if (pos < args.size()) return &args[pos];
    return kwarg(name);
}

// --- Value -------------------------------------------------------------------------------------

Value::Type Value::type() const {
    return static_cast<Type>(v_.index());
}

bool Value::truthy() const {
    switch (type()) {
        case Type::Undefined:
        case Type::None:
            return false;
        case Type::Bool:
            return as_bool();
        case Type::Int:
            return as_int() != 0;
        case Type::Float:
            return as_float() != 0.0;
        case Type::String:
            return !as_string().empty();
        case Type::Array:
            return !as_array().empty();
        case Type::Object:
            return as_object().size() != 0;
        case Type::Function:
            return true;
    }
    return false;
}

std::string_view Value::type_name() const {
    switch (type()) {
        case Type::Undefined:
            return "undefined";
        case Type::None:
            return "none";
        case Type::Bool:
            return "bool";
        case Type::Int:
            return "int";
        case Type::Float:
            return "float";
        case Type::String:
            return "string";
        case Type::Array:
            return "list";
        case Type::Object:
            return "dict";
        case Type::Function:
            return "function";
    }
    return "?";
}

// --- Object ------------------------------------------------------------------------------------

const Value* Object::find(std::string_view key) const {
    return const_cast<Object*>(this)->find(key);
}

Value* Object::find(std::string_view key) {
    if (index_.empty()) {
        for (auto& [k, v] : items_)
            if (k == key) return &v;
        return nullptr;
    }
    auto it = index_.find(std::string(key));
    return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Object::set(const std::string& key, Value v) {
    if (Value* existing = find(key)) {
        *existing = std::move(v);
        return;
    }
    items_.emplace_back(key, std::move(v));
    if (!index_.empty()) {
        index_.emplace(key, items_.size() - 1);
    } else if (items_.size() > kIndexThreshold) {
        for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first, i);
    }
}

bool Object::erase(std::string_view key) {
    auto it = std::find_if(items_.begin(), items_.end(), [&](const auto& kv) { return kv.first == key; });
    if (it == items_.end()) return false;
    items_.erase(it);
    index_.clear();
    if (items_.size() > kIndexThreshold)
        for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first, i);
    return true;
}

void Object::clear() {
    items_.clear();
    index_.clear();
}

// --- free functions ----------------------------------------------------------------------------

void Object::take_values(std::vector<Value>& out) {
    for (auto& kv : items_)
        if (kv.second.is_array() || kv.second.is_object()) out.push_back(std::move(kv.second));
}

namespace {

// While a container is being freed on this thread, the containers whose last owner dies with it
// wait in this list instead of being freed recursively. (A raw pointer: trivially destructible,
// so it is usable from any static destructor.)
thread_local std::vector<Value>* t_pending = nullptr;

template <typename T>
void move_children(T* p, std::vector<Value>& out) {
    if constexpr (std::is_same_v<T, Array>) {
        for (Value& v : *p)
            if (v.is_array() || v.is_object()) out.push_back(std::move(v));
    } else {
        p->take_values(out);
    }
}

template <typename T>
void free_container(T* p) {
    if (t_pending) {
        move_children(p, *t_pending);
        delete p;
        return;
    }
    std::vector<Value> pending;
    move_children(p, pending);
    delete p;
    t_pending = &pending;
    while (!pending.empty()) {
        Value v = std::move(pending.back());
        pending.pop_back();
    }
    t_pending = nullptr;
}

}  // namespace

Value make_array(Array items) {
    return Value(std::shared_ptr<Array>(new Array(std::move(items)), [](Array* p) { free_container(p); }));
}
Value make_object() {
    return Value(std::shared_ptr<Object>(new Object(), [](Object* p) { free_container(p); }));
}

std::string format_float(double f) {
    if (std::isnan(f)) return "nan";
    if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
    if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
    std::string sci(buf, res.ptr);  // "-d.ddde+XX"
    std::string sign;
    if (sci[0] == '-') {
        sign = "-";
        sci.erase(0, 1);
    }
    const size_t e = sci.find('e');
    std::string digits = sci.substr(0, e);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    const int exp = std::stoi(sci.substr(e + 1));
    const int decpt = exp + 1;  // value = 0.DIGITS * 10^decpt
    std::string out = sign;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out += "0.";
            out.append(static_cast<size_t>(-decpt), '0');
            out += digits;
        } else if (static_cast<size_t>(decpt) >= digits.size()) {
            out += digits;
            out.append(static_cast<size_t>(decpt) - digits.size(), '0');
            out += ".0";
        } else {
            out += digits.substr(0, decpt);
            out += '.';
            out += digits.substr(decpt);
        }
    } else {
        out += digits[0];
        if (digits.size() > 1) {
            out += '.';
            out += digits.substr(1);
        }
        out += 'e';
        out += exp < 0 ? '-' : '+';
        const int ae = exp < 0 ? -exp : exp;
        if (ae < 10) out += '0';
        out += std::to_string(ae);
    }
    return out;
}

std::string to_str(const Value& v, size_t max_bytes) {
    if (v.is_string()) return v.as_string();
    std::string out;
    str_into(out, v, false, 0, max_bytes);
    return out;
}

std::string repr(const Value& v, size_t max_bytes) {
    std::string out;
    str_into(out, v, true, 0, max_bytes);
    return out;
}

std::string to_json(const Value& v, const JsonOptions& opt) {
    JsonOptions o = opt;
    if (o.item_sep.empty()) o.item_sep = o.indent >= 0 ? "," : ", ";
    if (o.key_sep.empty()) o.key_sep = ": ";
    std::string out;
    json_into(out, v, o, 0);
    check_bytes(out, o.max_bytes);
    return out;
}

bool equals(const Value& a, const Value& b) {
    return equals_at(a, b, 0);
}

int compare(const Value& a, const Value& b) {
    return compare_at(a, b, 0);
}

Value from_json(const nlohmann::ordered_json& j, int max_depth) {
    if (max_depth < 0) throw ValueError("JSON input nested too deeply");
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null:
            return Value::none();
        case nlohmann::ordered_json::value_t::boolean:
            return Value(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer:
            return Value(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: {
            const auto u = j.get<uint64_t>();
            if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
            return Value(static_cast<int64_t>(u));
        }
        case nlohmann::ordered_json::value_t::number_float:
            return Value(j.get<double>());
        case nlohmann::ordered_json::value_t::string:
            return Value(j.get_ref<const std::string&>());
        case nlohmann::ordered_json::value_t::array: {
            Value a = make_array();
            a.as_array().reserve(j.size());
            for (const auto& e : j) a.as_array().push_back(from_json(e, max_depth - 1));
            return a;
        }
        case nlohmann::ordered_json::value_t::object: {
            Value o = make_object();
            for (const auto& [k, e] : j.items()) o.as_object().set(k, from_json(e, max_depth - 1));
            return o;
        }
        default:
            return Value::none();  // binary, discarded
    }
}

nlohmann::ordered_json value_to_json(const Value& v, int max_depth) {
    if (max_depth < 0) throw ValueError("value nested too deeply for JSON");
    switch (v.type()) {
        case Value::Type::Bool:
            return v.as_bool();
        case Value::Type::Int:
            return v.as_int();
        case Value::Type::Float:
            return v.as_float();
        case Value::Type::String:
            return v.as_string();
        case Value::Type::Array: {
            auto j = nlohmann::ordered_json::array();
            for (const Value& e : v.as_array()) j.push_back(value_to_json(e, max_depth - 1));
            return j;
        }
        case Value::Type::Object: {
            auto j = nlohmann::ordered_json::object();
            for (const auto& [k, e] : v.as_object().items()) j[k] = value_to_json(e, max_depth - 1);
            return j;
        }
        default:
            return nullptr;
    }
}

}  // namespace peregrine::jinja
