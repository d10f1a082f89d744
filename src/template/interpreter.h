// The evaluator: walks a Program with a scope chain, writing the output into a string. Internal
// to src/template (jinja.h is the public face); builtins.cc holds the filters, tests and methods.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "template/ast.h"
#include "template/jinja.h"
#include "template/value.h"

namespace peregrine::jinja {

struct Scope {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Scope> parent;

    const Value* lookup(const std::string& name) const;
};

class Interpreter {
  public:
    Interpreter(const Program& program, std::string_view source, std::string_view name, const RenderLimits& limits);
    ~Interpreter();

    std::string render(const Context& ctx);

    // --- for builtins ---
    Value call(const Value& fn, CallArgs& args);
    // Counts `units` of work against RenderLimits::max_work.
    void charge(uint64_t units);
    // Fails when a string or list of `size` bytes / items would pass the limits; charges for it.
    void check_string_size(size_t bytes);
    void check_list_size(size_t items);
    Value new_array(Array items = {});
    Value new_object();
    // A container changed in place: it is cleared when the render ends, which breaks any cycle.
    void note_mutation(const Value& container);
    const RenderLimits& limits() const { return limits_; }

  private:
    enum class Flow { Normal, Break, Continue };

    Flow exec_body(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
    Flow exec(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out);
    void exec_for(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out);
    void exec_set(const Node& node, const std::shared_ptr<Scope>& scope);
    void assign(const std::vector<std::string>& targets, const Value& v, Scope& scope);
    Value make_macro(const Node& node, const std::shared_ptr<Scope>& scope);
    Value make_caller(const Node& node, const std::shared_ptr<Scope>& scope);

    Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
    Value eval_impl(const Expr& e, const std::shared_ptr<Scope>& scope);
    Value eval_binary(const Expr& e, const std::shared_ptr<Scope>& scope);
    Value eval_compare(const Expr& e, const std::shared_ptr<Scope>& scope);
    void eval_args(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope, CallArgs& out);
    Value lookup(const std::string& name, const Scope& scope) const;

    void append(std::string& out, std::string_view s);
    [[noreturn]] void fail_at(uint32_t offset, const std::string& msg) const;

    struct DepthGuard {
        Interpreter& in;
        explicit DepthGuard(Interpreter& interp);
        ~DepthGuard() { --in.depth_; }
    };

    const Program& program_;
    std::string_view source_;
    std::string_view name_;
    RenderLimits limits_;
    int depth_ = 0;
    uint64_t work_ = 0;
    std::shared_ptr<Scope> globals_;
    // Weak references, pruned of dead ones as they grow, so a long render does not pile them up.
    template <typename T>
    struct WeakList {
        std::vector<std::weak_ptr<T>> items;
        size_t prune_at = 4096;
        void add(const std::shared_ptr<T>& p);
    };
    WeakList<Array> mutated_arrays_;  // containers changed in place
    WeakList<Object> mutated_objects_;
    WeakList<Scope> captured_;  // scopes captured by macros and callers
};

// builtins.cc
Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
// `obj.name`: a dict key, else a method bound to obj, else undefined.
Value get_attr(Interpreter& in, const Value& obj, const std::string& name);
// `obj[key]`: list/string index (negative from the end), dict key; undefined when absent.
Value get_item(Interpreter& in, const Value& obj, const Value& key);
Value slice(Interpreter& in, const Value& obj, const Value& start, const Value& stop, const Value& step);
// range, namespace, dict, raise_exception: null when `name` is not a builtin global.
const Value* builtin_global(const std::string& name);
// The items a for loop visits: list elements, dict keys, string characters; undefined is empty.
Array iterate(Interpreter& in, const Value& v);
// Python len(): code points of a string.
size_t length_of(const Value& v);
// Python printf-style formatting (`"%s and %d" % args`, the `format` filter): s, r, d, i, f, %%.
std::string percent_format(const std::string& fmt, const Array& args, size_t max_bytes);

}  // namespace peregrine::jinja
