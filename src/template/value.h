// The value model of the Jinja interpreter: undefined, none, bool, int, float, string, list,
// dict (insertion-ordered, string keys) and callable. Lists and dicts are shared by reference
// (as in Python: `namespace` attributes and `list.append` mutate in place); everything else is
// a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace peregrine::jinja {

class Value;
class Interpreter;

using Array = std::vector<Value>;

// Positional and keyword arguments of one call.
struct CallArgs {
    std::vector<Value> args;
    std::vector<std::pair<std::string, Value>> kwargs;

    // The keyword argument `name`, or nullptr.
    const Value* kwarg(std::string_view name) const;
    // Positional argument `pos` if given, else keyword `name`, else nullptr.
    const Value* get(size_t pos, std::string_view name) const;
};

// A callable: a built-in, a caller-defined function (e.g. the server's `strftime_now`), a macro.
struct Function {
    std::string name;
    std::function<Value(Interpreter&, CallArgs&)> fn;
};

struct Object;

class Value {
  public:
    enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

    Value() = default;  // undefined
    static Value none() { return Value(Tag::None); }
    Value(bool b) : v_(b) {}
    Value(int64_t i) : v_(i) {}
    Value(int i) : v_(int64_t{i}) {}
    Value(double f) : v_(f) {}
    Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
    Value(std::string_view s) : v_(std::make_shared<const std::string>(s)) {}
    Value(const char* s) : v_(std::make_shared<const std::string>(s)) {}
    Value(std::shared_ptr<Array> a) : v_(std::move(a)) {}
    Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}
    Value(std::shared_ptr<Function> f) : v_(std::move(f)) {}

    Type type() const;
    bool is_undefined() const { return v_.index() == 0; }
    bool is_none() const { return type() == Type::None; }
    bool is_bool() const { return std::holds_alternative<bool>(v_); }
    bool is_int() const { return std::holds_alternative<int64_t>(v_); }
    bool is_float() const { return std::holds_alternative<double>(v_); }
    bool is_number() const { return is_int() || is_float(); }
    bool is_string() const { return std::holds_alternative<std::shared_ptr<const std::string>>(v_); }
    bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
    bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
    bool is_function() const { return std::holds_alternative<std::shared_ptr<Function>>(v_); }

    bool as_bool() const { return std::get<bool>(v_); }
    int64_t as_int() const { return std::get<int64_t>(v_); }
    double as_float() const { return std::get<double>(v_); }
    double as_number() const { return is_int() ? static_cast<double>(as_int()) : as_float(); }
    const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
    Array& as_array() const { return *std::get<std::shared_ptr<Array>>(v_); }
    Object& as_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
    Function& as_function() const { return *std::get<std::shared_ptr<Function>>(v_); }
    const std::shared_ptr<Array>& array_ptr() const { return std::get<std::shared_ptr<Array>>(v_); }
    const std::shared_ptr<Object>& object_ptr() const { return std::get<std::shared_ptr<Object>>(v_); }

    // Python truthiness: undefined, none, false, 0, 0.0, "", [] and {} are false.
    bool truthy() const;
    // "undefined", "none", "boolean", "integer", "float", "string", "list", "dict", "function".
    std::string_view type_name() const;

  private:
    enum class Tag : uint8_t { None };
    explicit Value(Tag) : v_(nullptr) {}
    // Strings are shared too: copying a value (a variable lookup, a list of repeats) is O(1).
    std::variant<std::monostate, std::nullptr_t, bool, int64_t, double, std::shared_ptr<const std::string>,
                 std::shared_ptr<Array>, std::shared_ptr<Object>, std::shared_ptr<Function>>
        v_;
};

// A dict: string keys in insertion order.
struct Object {
    const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
    const Value* find(std::string_view key) const;
    Value* find(std::string_view key);
    void set(const std::string& key, Value v);  // replaces in place, or appends
    bool erase(std::string_view key);
    void clear();
    size_t size() const { return items_.size(); }
    // Moves the values out (the keys stay, with undefined values); for iterative destruction.
    void take_values(std::vector<Value>& out);

  private:
    std::vector<std::pair<std::string, Value>> items_;
    std::unordered_map<std::string, size_t> index_;  // key -> position; built once a dict grows past a few keys
};

// An error in an operation on values (a type mismatch, a missing argument, a limit reached). The
// interpreter adds the template name, line and column.
class ValueError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Lists and dicts are made here only: their deleter frees nested containers iteratively, so a
// list nested a million levels deep does not overflow the stack when it dies.
Value make_array(Array items = {});
Value make_object();

// Python `str(v)`: how `{{ v }}` prints a value. Undefined prints as "". Throws ValueError when
// the text would pass `max_bytes`.
std::string to_str(const Value& v, size_t max_bytes = SIZE_MAX);
// Python `repr(v)`: strings quoted, as inside a printed list or dict.
std::string repr(const Value& v, size_t max_bytes = SIZE_MAX);
// Python's float repr: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string format_float(double f);

// `json.dumps` as transformers' `tojson` calls it (ensure_ascii=False): separators ", " and ": ",
// or "," and ": " with an indent; undefined serialises as null.
struct JsonOptions {
    int indent = -1;       // < 0: one line
    std::string item_sep;  // empty: the default for the indent
    std::string key_sep;
    bool ensure_ascii = false;
    bool sort_keys = false;
    size_t max_bytes = SIZE_MAX;  // ValueError past this
};
std::string to_json(const Value& v, const JsonOptions& opt = {});

// Python `==` (1 == 1.0, true == 1, lists and dicts by content).
bool equals(const Value& a, const Value& b);
// Python `<` ordering for numbers and strings (and lists, element-wise); throws ValueError otherwise.
int compare(const Value& a, const Value& b);

// JSON -> value (objects keep their key order); throws ValueError past `max_depth` levels.
Value from_json(const nlohmann::ordered_json& j, int max_depth = 256);
// Value -> JSON; functions become null.
nlohmann::ordered_json value_to_json(const Value& v, int max_depth = 256);

// Nesting deeper than this in printing, JSON, comparisons fails instead of overflowing the stack
// (a template can build self-referencing lists).
inline constexpr int kMaxValueDepth = 256;

// Python's ints include bools (True + 1 == 2): the operands integer arithmetic accepts.
inline bool is_intlike(const Value& v) {
    return v.is_int() || v.is_bool();
}
inline int64_t int_of(const Value& v) {
    return v.is_bool() ? int64_t{v.as_bool()} : v.as_int();
}

}  // namespace peregrine::jinja
