#include "template/interpreter.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "template/parser.h"

namespace peregrine::jinja {

namespace {

bool is_numeric(const Value& v) {
    return v.is_number() || v.is_bool();
}
double num_of(const Value& v) {
    return v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_number();
}

[[noreturn]] void bad_operands(std::string_view op, const Value& a, const Value& b) {
    throw ValueError("unsupported operand types for " + std::string(op) + ": " + std::string(a.type_name()) + " and " +
                     std::string(b.type_name()));
}

Value deep_copy(const Value& v, int depth) {
    if (depth > kMaxValueDepth) throw ValueError("context value nested too deeply");
    if (v.is_array()) {
        Array items;
        items.reserve(v.as_array().size());
        for (const Value& e : v.as_array()) items.push_back(deep_copy(e, depth + 1));
        return make_array(std::move(items));
    }
    if (v.is_object()) {
        Value o = make_object();
        for (const auto& [k, e] : v.as_object().items()) o.as_object().set(k, deep_copy(e, depth + 1));
        return o;
    }
    return v;
}

}  // namespace

const Value* Scope::lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
        auto it = s->vars.find(name);
        if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
}

Interpreter::DepthGuard::DepthGuard(Interpreter& interp) : in(interp) {
    if (in.depth_ >= in.limits_.max_depth)
        throw ValueError("nesting deeper than " + std::to_string(in.limits_.max_depth) +
                         " levels (a macro that calls itself without end?)");
    ++in.depth_;
}

Interpreter::Interpreter(const Program& program, std::string_view source, std::string_view name,
                         const RenderLimits& limits)
    : program_(program), source_(source), name_(name), limits_(limits) {}

template <typename T>
void Interpreter::WeakList<T>::add(const std::shared_ptr<T>& p) {
    if (!items.empty() && items.back().lock() == p) return;  // appends in a loop
    items.push_back(p);
    if (items.size() < prune_at) return;
    std::erase_if(items, [](const std::weak_ptr<T>& w) { return w.expired(); });
    prune_at = std::max<size_t>(4096, 2 * items.size());
}

Interpreter::~Interpreter() {
    // Break reference cycles (a list appended to itself, a macro stored in the scope it captured):
    // empty every container changed in place and every captured scope. Nested containers are freed
    // iteratively by their deleter.
    for (auto& w : mutated_arrays_.items)
        if (auto a = w.lock()) a->clear();
    for (auto& w : mutated_objects_.items)
        if (auto o = w.lock()) o->clear();
    for (auto& w : captured_.items) {
        if (auto s = w.lock()) {
            auto vars = std::move(s->vars);
            s->vars.clear();
        }
    }
    if (globals_) globals_->vars.clear();
}

std::string Interpreter::render(const Context& ctx) {
    globals_ = std::make_shared<Scope>();
    for (const auto& [name, v] : ctx.vars()) globals_->vars[name] = deep_copy(v, 0);
    std::string out;
    exec_body(program_.body, globals_, out);
    return out;
}

void Interpreter::fail_at(uint32_t offset, const std::string& msg) const {
    const auto [line, col] = line_col(source_, offset);
    fail(name_, ":", line, ":", col, ": ", msg);
}

void Interpreter::charge(uint64_t units) {
    work_ += units;
    if (work_ > limits_.max_work)
        throw ValueError("the template did too much work (more than " + std::to_string(limits_.max_work) +
                         " steps: loop iterations, calls, items)");
}

void Interpreter::check_string_size(size_t bytes) {
    if (bytes > limits_.max_output_bytes)
        throw ValueError("a string of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                         std::to_string(limits_.max_output_bytes));
    charge(bytes / 64);
}

void Interpreter::check_list_size(size_t items) {
    if (items > limits_.max_work) throw ValueError("a list of " + std::to_string(items) + " items is too long");
    charge(items);
}

Value Interpreter::new_array(Array items) {
    check_list_size(items.size());
    return make_array(std::move(items));
}

Value Interpreter::new_object() {
    charge(1);
    return make_object();
}

void Interpreter::note_mutation(const Value& container) {
    if (container.is_array()) mutated_arrays_.add(container.array_ptr());
    if (container.is_object()) mutated_objects_.add(container.object_ptr());
}

void Interpreter::append(std::string& out, std::string_view s) {
    if (out.size() + s.size() > limits_.max_output_bytes)
        throw ValueError("the output exceeds the limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
    charge(s.size() / 64);
    out.append(s);
}

Value Interpreter::lookup(const std::string& name, const Scope& scope) const {
    if (const Value* v = scope.lookup(name)) return *v;
    if (const Value* b = builtin_global(name)) return *b;
    return Value();
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
    if (!fn.is_function()) throw ValueError(std::string(fn.type_name()) + " is not callable");
    charge(4);  // a call may allocate a scope
    return fn.as_function().fn(*this, args);
}

// --- statements ----------------------------------------------------------------------------------

Interpreter::Flow Interpreter::exec_body(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out) {
    for (const NodePtr& n : body) {
        const Flow f = exec(*n, scope, out);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out) {
    try {
        DepthGuard guard(*this);
        switch (node.kind) {
            case Node::Kind::Text:
                append(out, node.text);
                break;
            case Node::Kind::Output: {
                const Value v = eval(*node.expr, scope);
                if (v.is_string())
                    append(out, v.as_string());
                else
                    append(out, to_str(v, limits_.max_output_bytes));
                break;
            }
            case Node::Kind::If:
                for (const auto& [cond, body] : node.branches)
                    if (!cond || eval(*cond, scope).truthy()) return exec_body(body, scope, out);
                break;
            case Node::Kind::For:
                exec_for(node, scope, out);
                break;
            case Node::Kind::Set:
                exec_set(node, scope);
                break;
            case Node::Kind::SetBlock: {
                std::string text;
                const Flow f = exec_body(node.body, scope, text);
                if (f != Flow::Normal) return f;
                Value v(std::move(text));
                if (node.expr) {
                    std::vector<const Expr*> chain;  // outermost first
                    for (const Expr* e = node.expr.get(); e; e = e->args[0].get()) chain.push_back(e);
                    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
                        CallArgs a;
                        eval_args(**it, 1, scope, a);
                        v = apply_filter(*this, (*it)->name, v, a);
                    }
                }
                assign(node.targets, v, *scope);
                break;
            }
            case Node::Kind::Macro:
                scope->vars[node.text] = make_macro(node, scope);
                break;
            case Node::Kind::CallBlock: {
                const Expr& call = *node.expr;
                Value fn = eval(*call.args[0], scope);
                CallArgs a;
                eval_args(call, 1, scope, a);
                a.kwargs.emplace_back("caller", make_caller(node, scope));
                const Value r = this->call(fn, a);
                append(out, to_str(r, limits_.max_output_bytes));
                break;
            }
            case Node::Kind::FilterBlock: {
                std::string text;
                const Flow f = exec_body(node.body, scope, text);
                if (f != Flow::Normal) return f;
                Value v(std::move(text));
                std::vector<const Expr*> chain;
                for (const Expr* e = node.expr.get(); e; e = e->args[0].get()) chain.push_back(e);
                for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
                    CallArgs a;
                    eval_args(**it, 1, scope, a);
                    v = apply_filter(*this, (*it)->name, v, a);
                }
                append(out, to_str(v, limits_.max_output_bytes));
                break;
            }
            case Node::Kind::Break:
                return Flow::Break;
            case Node::Kind::Continue:
                return Flow::Continue;
            case Node::Kind::Do:
                eval(*node.expr, scope);
                break;
            case Node::Kind::With: {
                auto inner = std::make_shared<Scope>();
                inner->parent = scope;
                for (const auto& [name, e] : node.params) inner->vars[name] = eval(*e, scope);
                return exec_body(node.body, inner, out);
            }
            case Node::Kind::Scope:
                return exec_body(node.body, scope, out);
        }
    } catch (const ValueError& err) {
        fail_at(node.offset, err.what());
    }
    return Flow::Normal;
}

void Interpreter::assign(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
        scope.vars[targets[0]] = v;
        return;
    }
    if (!v.is_array())
        throw ValueError("cannot unpack a " + std::string(v.type_name()) + " into " + std::to_string(targets.size()) +
                         " names");
    const Array& a = v.as_array();
    if (a.size() != targets.size())
        throw ValueError(std::string(a.size() < targets.size() ? "not enough" : "too many") +
                         " values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                         std::to_string(a.size()) + ")");
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = a[i];
}

void Interpreter::exec_set(const Node& node, const std::shared_ptr<Scope>& scope) {
    Value v = eval(*node.expr, scope);
    if (!node.attr.empty()) {
        Value target = lookup(node.targets[0], *scope);
        if (!target.is_object())
            throw ValueError("cannot set attribute '" + node.attr + "' on " + std::string(target.type_name()) + " '" +
                             node.targets[0] + "' (only a namespace or dict)");
        target.as_object().set(node.attr, std::move(v));
        note_mutation(target);
        return;
    }
    assign(node.targets, v, *scope);
}

void Interpreter::exec_for(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out) {
    const Value iterable = eval(*node.expr, scope);
    Array items = iterate(*this, iterable);
    auto loop_scope = std::make_shared<Scope>();
    loop_scope->parent = scope;
    if (node.cond) {  // `for x in xs if cond`: filter first; loop.length counts what is left
        Array kept;
        for (Value& item : items) {
            charge(1);
            assign(node.targets, item, *loop_scope);
            if (eval(*node.cond, loop_scope).truthy()) kept.push_back(std::move(item));
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        exec_body(node.else_body, loop_scope, out);
        return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    Value loop = make_object();
    Object& lo = loop.as_object();
    {
        auto cycle = std::make_shared<Function>();
        cycle->name = "loop.cycle";
        std::weak_ptr<Object> weak = loop.object_ptr();
        cycle->fn = [weak](Interpreter&, CallArgs& a) -> Value {
            auto o = weak.lock();
            if (!o || a.args.empty()) return Value();
            const Value* i = o->find("index0");
            const int64_t k = i && i->is_int() ? i->as_int() : 0;
            return a.args[static_cast<size_t>(k % static_cast<int64_t>(a.args.size()))];
        };
        lo.set("cycle", Value(std::move(cycle)));
    }
    lo.set("length", Value(n));
    lo.set("depth", Value(int64_t{1}));
    lo.set("depth0", Value(int64_t{0}));
    for (int64_t i = 0; i < n; ++i) {
        charge(1);
        lo.set("index", Value(i + 1));
        lo.set("index0", Value(i));
        lo.set("revindex", Value(n - i));
        lo.set("revindex0", Value(n - i - 1));
        lo.set("first", Value(i == 0));
        lo.set("last", Value(i == n - 1));
        lo.set("previtem", i > 0 ? items[i - 1] : Value());
        lo.set("nextitem", i + 1 < n ? items[i + 1] : Value());
        loop_scope->vars["loop"] = loop;
        assign(node.targets, items[i], *loop_scope);
        const Flow f = exec_body(node.body, loop_scope, out);
        if (f == Flow::Break) break;
    }
    lo.clear();  // previtem/nextitem could hold the loop object itself
}

Value Interpreter::make_macro(const Node& node, const std::shared_ptr<Scope>& scope) {
    captured_.add(scope);
    auto f = std::make_shared<Function>();
    f->name = node.text;
    const Node* np = &node;
    f->fn = [np, scope](Interpreter& in, CallArgs& a) -> Value {
        const Node& m = *np;
        auto s = std::make_shared<Scope>();
        s->parent = scope;
        const size_t num_params = m.params.size();
        std::vector<bool> bound(num_params, false);
        Array varargs;
        for (size_t i = 0; i < a.args.size(); ++i) {
            if (i < num_params) {
                s->vars[m.params[i].first] = a.args[i];
                bound[i] = true;
            } else {
                varargs.push_back(a.args[i]);
            }
        }
        Value kwargs = make_object();
        for (auto& [k, v] : a.kwargs) {
            if (k == "caller") {
                s->vars["caller"] = v;
                continue;
            }
            size_t idx = num_params;
            for (size_t i = 0; i < num_params; ++i)
                if (m.params[i].first == k) idx = i;
            if (idx == num_params) {
                kwargs.as_object().set(k, v);
                continue;
            }
            if (bound[idx]) throw ValueError("macro '" + m.text + "' got multiple values for argument '" + k + "'");
            s->vars[k] = v;
            bound[idx] = true;
        }
        for (size_t i = 0; i < num_params; ++i) {
            if (bound[i]) continue;
            s->vars[m.params[i].first] = m.params[i].second ? in.eval(*m.params[i].second, s) : Value();
        }
        s->vars["varargs"] = in.new_array(std::move(varargs));
        s->vars["kwargs"] = std::move(kwargs);
        if (!s->vars.count("caller")) s->vars["caller"] = Value();
        std::string out;
        in.exec_body(m.body, s, out);
        return Value(std::move(out));
    };
    return Value(std::move(f));
}

Value Interpreter::make_caller(const Node& node, const std::shared_ptr<Scope>& scope) {
    captured_.add(scope);
    auto f = std::make_shared<Function>();
    f->name = "caller";
    const Node* np = &node;
    f->fn = [np, scope](Interpreter& in, CallArgs& a) -> Value {
        const Node& m = *np;
        auto s = std::make_shared<Scope>();
        s->parent = scope;
        for (size_t i = 0; i < m.params.size(); ++i) {
            const Value* given = a.get(i, m.params[i].first);
            s->vars[m.params[i].first] = given                ? *given
                                         : m.params[i].second ? in.eval(*m.params[i].second, s)
                                                              : Value();
        }
        std::string out;
        in.exec_body(m.body, s, out);
        return Value(std::move(out));
    };
    return Value(std::move(f));
}

// --- expressions ---------------------------------------------------------------------------------

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
    try {
        DepthGuard guard(*this);
        return eval_impl(e, scope);
    } catch (const ValueError& err) {
        fail_at(e.offset, err.what());
    }
}

void Interpreter::eval_args(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope, CallArgs& out) {
    for (size_t i = first; i < e.args.size(); ++i) out.args.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) out.kwargs.emplace_back(k, eval(*v, scope));
}

Value Interpreter::eval_impl(const Expr& e, const std::shared_ptr<Scope>& scope) {
    switch (e.kind) {
        case Expr::Kind::Literal:
            return e.value;
        case Expr::Kind::Name:
            return lookup(e.name, *scope);
        case Expr::Kind::List:
        case Expr::Kind::Tuple: {
            Array items;
            items.reserve(e.args.size());
            for (const auto& a : e.args) items.push_back(eval(*a, scope));
            return new_array(std::move(items));
        }
        case Expr::Kind::Dict: {
            Value o = new_object();
            for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
                Value k = eval(*e.args[i], scope);
                if (!k.is_string()) {
                    if (!k.is_int() && !k.is_bool() && !k.is_none())
                        throw ValueError("dict keys must be strings, not " + std::string(k.type_name()));
                    k = Value(to_str(k));
                }
                o.as_object().set(k.as_string(), eval(*e.args[i + 1], scope));
            }
            return o;
        }
        case Expr::Kind::Unary: {
            const Value v = eval(*e.args[0], scope);
            if (e.name == "not") return Value(!v.truthy());
            if (v.is_float()) return Value(e.name == "-" ? -v.as_float() : v.as_float());
            if (is_intlike(v)) {
                const int64_t i = int_of(v);
                if (e.name == "+") return Value(i);
                if (i == INT64_MIN) throw ValueError("integer overflow");
                return Value(-i);
            }
            throw ValueError("bad operand type for unary " + e.name + ": " + std::string(v.type_name()));
        }
        case Expr::Kind::Binary:
            return eval_binary(e, scope);
        case Expr::Kind::Compare:
            return eval_compare(e, scope);
        case Expr::Kind::GetAttr:
            return get_attr(*this, eval(*e.args[0], scope), e.name);
        case Expr::Kind::GetItem: {
            const Value obj = eval(*e.args[0], scope);
            return get_item(*this, obj, eval(*e.args[1], scope));
        }
        case Expr::Kind::Slice: {
            const Value obj = eval(*e.args[0], scope);
            Value parts[3];
            for (int i = 0; i < 3; ++i)
                if (e.args[i + 1]) parts[i] = eval(*e.args[i + 1], scope);
            return slice(*this, obj, parts[0], parts[1], parts[2]);
        }
        case Expr::Kind::Call: {
            const Value fn = eval(*e.args[0], scope);
            if (!fn.is_function()) {
                const Expr& callee = *e.args[0];
                if (callee.kind == Expr::Kind::Name)
                    throw ValueError("'" + callee.name + "' is " + (fn.is_undefined() ? "undefined" : "not callable"));
                if (callee.kind == Expr::Kind::GetAttr)
                    throw ValueError("'" + callee.name + "' is " +
                                     (fn.is_undefined() ? "not a method or attribute here" : "not callable"));
                throw ValueError(std::string(fn.type_name()) + " is not callable");
            }
            CallArgs a;
            eval_args(e, 1, scope, a);
            return call(fn, a);
        }
        case Expr::Kind::Filter: {
            const Value v = eval(*e.args[0], scope);
            CallArgs a;
            eval_args(e, 1, scope, a);
            return apply_filter(*this, e.name, v, a);
        }
        case Expr::Kind::Test: {
            const Value v = eval(*e.args[0], scope);
            CallArgs a;
            eval_args(e, 1, scope, a);
            const bool r = apply_test(*this, e.name, v, a);
            return Value(e.negated ? !r : r);
        }
        case Expr::Kind::Cond:
            if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
            return e.args[2] ? eval(*e.args[2], scope) : Value();
    }
    return Value();
}

Value Interpreter::eval_binary(const Expr& e, const std::shared_ptr<Scope>& scope) {
    const std::string& op = e.name;
    if (op == "and") {
        Value l = eval(*e.args[0], scope);
        return l.truthy() ? eval(*e.args[1], scope) : l;
    }
    if (op == "or") {
        Value l = eval(*e.args[0], scope);
        return l.truthy() ? l : eval(*e.args[1], scope);
    }
    const Value a = eval(*e.args[0], scope);
    const Value b = eval(*e.args[1], scope);
    if (op == "~") {
        std::string s = to_str(a, limits_.max_output_bytes);
        s += to_str(b, limits_.max_output_bytes);
        check_string_size(s.size());
        return Value(std::move(s));
    }
    const bool ints = is_intlike(a) && is_intlike(b);
    const bool nums = is_numeric(a) && is_numeric(b);
    if (op == "+") {
        if (ints) {
            int64_t r = 0;
            if (__builtin_add_overflow(int_of(a), int_of(b), &r)) throw ValueError("integer overflow");
            return Value(r);
        }
        if (nums) return Value(num_of(a) + num_of(b));
        if (a.is_array() && b.is_array()) {
            check_list_size(a.as_array().size() + b.as_array().size());
            Array items = a.as_array();
            items.insert(items.end(), b.as_array().begin(), b.as_array().end());
            return make_array(std::move(items));
        }
        if ((a.is_string() || b.is_string()) && !a.is_undefined() && !b.is_undefined()) {
            // Python requires both to be strings; the reference renderer joins their text
            std::string s = to_str(a, limits_.max_output_bytes);
            s += to_str(b, limits_.max_output_bytes);
            check_string_size(s.size());
            return Value(std::move(s));
        }
        bad_operands(op, a, b);
    }
    if (op == "-") {
        if (ints) {
            int64_t r = 0;
            if (__builtin_sub_overflow(int_of(a), int_of(b), &r)) throw ValueError("integer overflow");
            return Value(r);
        }
        if (nums) return Value(num_of(a) - num_of(b));
        bad_operands(op, a, b);
    }
    if (op == "*") {
        if (ints) {
            int64_t r = 0;
            if (__builtin_mul_overflow(int_of(a), int_of(b), &r)) throw ValueError("integer overflow");
            return Value(r);
        }
        if (nums) return Value(num_of(a) * num_of(b));
        const Value* seq = a.is_string() || a.is_array() ? &a : b.is_string() || b.is_array() ? &b : nullptr;
        const Value* count = seq == &a ? &b : &a;
        if (seq && is_intlike(*count)) {
            // An empty sequence repeated stays empty: no loop of n (found by the fuzzer: '' * 7744**3).
            const bool empty = seq->is_string() ? seq->as_string().empty() : seq->as_array().empty();
            const int64_t n = empty ? 0 : std::max<int64_t>(0, int_of(*count));
            if (seq->is_string()) {
                const size_t unit = seq->as_string().size();
                if (unit && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit)
                    check_string_size(limits_.max_output_bytes + 1);
                check_string_size(unit * static_cast<size_t>(n));
                std::string s;
                s.reserve(unit * static_cast<size_t>(n));
                for (int64_t i = 0; i < n; ++i) s += seq->as_string();
                return Value(std::move(s));
            }
            const size_t unit = seq->as_array().size();
            if (unit && static_cast<uint64_t>(n) > limits_.max_work / unit) check_list_size(limits_.max_work + 1);
            check_list_size(unit * static_cast<size_t>(n));
            Array items;
            for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->as_array().begin(), seq->as_array().end());
            return make_array(std::move(items));
        }
        bad_operands(op, a, b);
    }
    if (op == "/") {
        if (!nums) bad_operands(op, a, b);
        if (num_of(b) == 0.0) throw ValueError("division by zero");
        return Value(num_of(a) / num_of(b));
    }
    if (op == "//") {
        if (!nums) bad_operands(op, a, b);
        if (num_of(b) == 0.0) throw ValueError("integer division or modulo by zero");
        if (ints) {
            const int64_t x = int_of(a), y = int_of(b);
            if (x == INT64_MIN && y == -1) throw ValueError("integer overflow");
            int64_t q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
            return Value(q);
        }
        return Value(std::floor(num_of(a) / num_of(b)));
    }
    if (op == "%") {
        if (a.is_string()) {
            std::string s =
                percent_format(a.as_string(), b.is_array() ? b.as_array() : Array{b}, limits_.max_output_bytes);
            check_string_size(s.size());
            return Value(std::move(s));
        }
        if (!nums) bad_operands(op, a, b);
        if (num_of(b) == 0.0) throw ValueError("integer division or modulo by zero");
        if (ints) {
            const int64_t x = int_of(a), y = int_of(b);
            if (y == -1) return Value(int64_t{0});
            int64_t r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
            return Value(r);
        }
        const double x = num_of(a), y = num_of(b);
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value(r);
    }
    if (op == "**") {
        if (!nums) bad_operands(op, a, b);
        if (ints && int_of(b) >= 0) {
            int64_t base = int_of(a), exp = int_of(b), r = 1;
            while (exp > 0) {
                if ((exp & 1) && __builtin_mul_overflow(r, base, &r)) throw ValueError("integer overflow");
                exp >>= 1;
                if (exp && __builtin_mul_overflow(base, base, &base)) throw ValueError("integer overflow");
            }
            return Value(r);
        }
        return Value(std::pow(num_of(a), num_of(b)));
    }
    throw ValueError("unknown operator " + op);
}

namespace {

bool contains(const Value& container, const Value& item) {
    switch (container.type()) {
        case Value::Type::Undefined:
            return false;
        case Value::Type::String:
            if (!item.is_string())
                throw ValueError("'in <string>' requires a string on the left, not " + std::string(item.type_name()));
            return container.as_string().find(item.as_string()) != std::string::npos;
        case Value::Type::Array:
            for (const Value& v : container.as_array())
                if (equals(v, item)) return true;
            return false;
        case Value::Type::Object:
            if (!item.is_string()) return false;
            return container.as_object().find(item.as_string()) != nullptr;
        default:
            throw ValueError("argument of type " + std::string(container.type_name()) + " is not iterable");
    }
}

}  // namespace

Value Interpreter::eval_compare(const Expr& e, const std::shared_ptr<Scope>& scope) {
    Value left = eval(*e.args[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], scope);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==")
            r = equals(left, right);
        else if (op == "!=")
            r = !equals(left, right);
        else if (op == "in")
            r = contains(right, left);
        else if (op == "not in")
            r = !contains(right, left);
        else {
            const int c = compare(left, right);
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value(false);
        left = std::move(right);
    }
    return Value(true);
}

// --- public API ----------------------------------------------------------------------------------

void Context::set(const std::string& name, Value v) {
    for (auto& [k, old] : vars_) {
        if (k == name) {
            old = std::move(v);
            return;
        }
    }
    vars_.emplace_back(name, std::move(v));
}

void Context::set_json(const std::string& name, const nlohmann::ordered_json& j) {
    try {
        set(name, from_json(j));
    } catch (const ValueError& e) {
        fail("template variable '", name, "': ", e.what());
    }
}

void Context::set_function(const std::string& name, std::function<Value(CallArgs&)> fn) {
    auto f = std::make_shared<Function>();
    f->name = name;
    f->fn = [fn = std::move(fn)](Interpreter&, CallArgs& a) { return fn(a); };
    set(name, Value(std::move(f)));
}

void Context::erase(const std::string& name) {
    for (auto it = vars_.begin(); it != vars_.end(); ++it) {
        if (it->first == name) {
            vars_.erase(it);
            return;
        }
    }
}

Template::Template(std::string source, std::string name, LexOptions options)
    : source_(std::move(source)), name_(std::move(name)) {
    // As Jinja: newlines normalised to "\n", and a single trailing newline dropped.
    std::string normalised;
    normalised.reserve(source_.size());
    for (size_t i = 0; i < source_.size(); ++i) {
        if (source_[i] == '\r') {
            normalised += '\n';
            if (i + 1 < source_.size() && source_[i + 1] == '\n') ++i;
        } else {
            normalised += source_[i];
        }
    }
    if (!normalised.empty() && normalised.back() == '\n') normalised.pop_back();
    source_ = std::move(normalised);
    program_ = std::make_shared<Program>(parse(source_, name_, options));
}

std::string Template::render(const Context& ctx, const RenderLimits& limits) const {
    Interpreter in(*program_, source_, name_, limits);
    return in.render(ctx);
}

}  // namespace peregrine::jinja
