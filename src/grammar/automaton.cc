#include "grammar/automaton.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace peregrine::grammar {

namespace {

// --- per rule: epsilon-NFA (Thompson) ---------------------------------------------------------

struct EState {
    std::vector<int> eps;
    std::vector<std::pair<ByteSet, int>> bytes;
    std::vector<std::pair<int, int>> calls;  // (rule, target)
};

// Thompson construction. Invariant: build(e, from) never adds an edge into `from` (loops get a
// fresh state), so siblings of an alternation may share their start state.
class NfaBuilder {
  public:
    NfaBuilder(const Grammar& g, size_t& budget, const std::string& rule) : g_(g), budget_(budget), rule_(rule) {}
    std::vector<EState> states;

    int state() {
        if (budget_ == 0) fail("grammar too large: over the automaton size cap while compiling rule '", rule_, "'");
        --budget_;
        states.emplace_back();
        return static_cast<int>(states.size()) - 1;
    }
    void eps(int a, int b) {
        if (a != b) states[size_t(a)].eps.push_back(b);
    }

    int build(int ei, int from) {
        const Expr& e = g_.exprs[size_t(ei)];
        switch (e.kind) {
            case Expr::Kind::Empty:
                return from;
            case Expr::Kind::Bytes: {
                int s = state();
                states[size_t(from)].bytes.emplace_back(e.bytes, s);
                return s;
            }
            case Expr::Kind::Ref: {
                if (e.rule < 0 || size_t(e.rule) >= g_.rules.size() || g_.rules[size_t(e.rule)].body < 0)
                    fail("grammar refers to an undefined rule", e.rule >= 0 && size_t(e.rule) < g_.rules.size()
                                                                    ? " '" + g_.rules[size_t(e.rule)].name + "'"
                                                                    : std::string());
                int s = state();
                states[size_t(from)].calls.emplace_back(e.rule, s);
                return s;
            }
            case Expr::Kind::Seq: {
                int cur = from;
                for (int c : e.children) cur = build(c, cur);
                return cur;
            }
            case Expr::Kind::Alt: {
                int end = state();
                for (int c : e.children) eps(build(c, from), end);
                return end;
            }
            case Expr::Kind::Repeat: {
                int cur = from;
                for (int i = 0; i < e.min; ++i) cur = build(e.children[0], cur);
                if (e.max == kUnbounded) {
                    int loop = state();
                    eps(cur, loop);
                    int back = build(e.children[0], loop);
                    if (back != loop) states[size_t(back)].eps.push_back(loop);
                    return loop;
                }
                int end = state();
                for (int i = e.min; i < e.max; ++i) {
                    eps(cur, end);
                    cur = build(e.children[0], cur);
                }
                eps(cur, end);
                return end;
            }
            case Expr::Kind::Subset:
                return build_subset(e, from);
        }
        return from;
    }

  private:
    // a[k]: at item k, nothing emitted yet; b[k]: at item k, something emitted (so a separator
    // comes first). Each item is built twice (from a[k] and after a separator from b[k]).
    int build_subset(const Expr& e, int from) {
        size_t n = e.children.size();
        std::vector<int> a(n + 1), b(n + 1, -1);
        a[0] = from;
        for (size_t k = 1; k <= n; ++k) {
            a[k] = state();
            b[k] = state();
        }
        for (size_t k = 0; k < n; ++k) {
            int item = e.children[k];
            eps(build(item, a[k]), b[k + 1]);
            if (!e.required[k]) eps(a[k], a[k + 1]);
            if (b[k] >= 0) {
                eps(build(item, build(e.sep, b[k])), b[k + 1]);
                if (!e.required[k]) eps(b[k], b[k + 1]);
            }
        }
        int end = state();
        eps(a[n], end);
        if (b[n] >= 0) eps(b[n], end);
        if (e.tail >= 0) {
            int more = state();  // after at least one tail item
            eps(build(e.tail, a[n]), more);
            if (b[n] >= 0) eps(build(e.tail, build(e.sep, b[n])), more);
            eps(build(e.tail, build(e.sep, more)), more);
            eps(more, end);
        }
        return end;
    }

    const Grammar& g_;
    size_t& budget_;
    const std::string& rule_;
};

// --- per rule: epsilon-free automaton, then DFA -----------------------------------------------

struct LNode {
    std::vector<std::pair<ByteSet, int>> bytes;
    std::vector<std::pair<int, int>> calls;
    bool final = false;
};

// Folds epsilon closures into edges. Work is bounded by `edge_budget` (closures can make the
// edge count quadratic, e.g. (a?){n}): over it, the grammar is too large.
std::vector<LNode> remove_epsilon(const std::vector<EState>& st, int start, int accept, size_t& edge_budget,
                                  const std::string& rule) {
    size_t n = st.size();
    std::vector<int> index(n, -1), order;
    std::vector<LNode> out;
    std::vector<uint32_t> stamp(n, 0);
    uint32_t round = 0;
    std::vector<int> stack, seen;
    auto closure = [&](int s) {
        ++round;
        stack.assign(1, s);
        seen.assign(1, s);
        stamp[size_t(s)] = round;
        while (!stack.empty()) {
            int x = stack.back();
            stack.pop_back();
            for (int y : st[size_t(x)].eps)
                if (stamp[size_t(y)] != round) {
                    stamp[size_t(y)] = round;
                    seen.push_back(y);
                    stack.push_back(y);
                }
        }
    };
    auto intern = [&](int s) {
        if (index[size_t(s)] < 0) {
            index[size_t(s)] = static_cast<int>(order.size());
            order.push_back(s);
        }
        return index[size_t(s)];
    };
    intern(start);
    for (size_t i = 0; i < order.size(); ++i) {
        LNode node;
        closure(order[i]);
        for (int x : seen) {
            if (x == accept) node.final = true;
            size_t edges = st[size_t(x)].bytes.size() + st[size_t(x)].calls.size() + 1;
            if (edges > edge_budget)
                fail("grammar too large: over the automaton size cap while compiling rule '", rule, "'");
            edge_budget -= edges;
            for (auto& [set, t] : st[size_t(x)].bytes) node.bytes.emplace_back(set, t);
            for (auto& [r, t] : st[size_t(x)].calls) node.calls.emplace_back(r, t);
        }
        for (auto& [set, t] : node.bytes) t = intern(t);
        for (auto& [r, t] : node.calls) t = intern(t);
        out.push_back(std::move(node));
    }
    return out;
}

// Subset construction; returns false (leaving `out` unspecified) when over `max_states` or when
// its work (member edges scanned per byte) goes over `work` (then the NFA is kept).
bool determinize(const std::vector<LNode>& nfa, size_t max_states, size_t work, std::vector<LNode>& out) {
    std::map<std::vector<int>, int> ids;
    std::vector<std::vector<int>> sets{{0}};
    ids[{0}] = 0;
    out.clear();
    auto id_of = [&](std::vector<int> s) {
        std::sort(s.begin(), s.end());
        s.erase(std::unique(s.begin(), s.end()), s.end());
        auto [it, added] = ids.emplace(s, static_cast<int>(sets.size()));
        if (added) sets.push_back(std::move(s));
        return it->second;
    };
    for (size_t i = 0; i < sets.size(); ++i) {
        if (sets.size() > max_states) return false;
        LNode node;
        std::vector<std::pair<ByteSet, int>> edges;
        std::map<int, std::vector<int>> calls;
        for (int m : sets[i]) {
            const LNode& x = nfa[size_t(m)];
            node.final |= x.final;
            edges.insert(edges.end(), x.bytes.begin(), x.bytes.end());
            for (auto [r, t] : x.calls) calls[r].push_back(t);
        }
        if (edges.size() * 256 > work) return false;
        work -= edges.size() * 256;
        // Group bytes by their target set; equal target sets share one DFA node.
        std::map<std::vector<int>, ByteSet> by_target;
        for (int b = 0; b < 256; ++b) {
            std::vector<int> tgt;
            for (auto& [set, t] : edges)
                if (set.has(uint8_t(b))) tgt.push_back(t);
            if (tgt.empty()) continue;
            std::sort(tgt.begin(), tgt.end());
            tgt.erase(std::unique(tgt.begin(), tgt.end()), tgt.end());
            by_target[tgt].set(uint8_t(b));
        }
        for (auto& [tgt, set] : by_target) node.bytes.emplace_back(set, id_of(tgt));
        for (auto& [r, tgt] : calls) node.calls.emplace_back(r, id_of(tgt));
        out.push_back(std::move(node));
    }
    return true;
}

void to_ranges(const ByteSet& s, int32_t target, std::vector<ByteEdge>& out) {
    for (int b = 0; b < 256;) {
        if (!s.has(uint8_t(b))) {
            ++b;
            continue;
        }
        int e = b;
        while (e + 1 < 256 && s.has(uint8_t(e + 1))) ++e;
        out.push_back(ByteEdge{uint8_t(b), uint8_t(e), target});
        b = e + 1;
    }
}

// --- whole-grammar analyses --------------------------------------------------------------------

// Marks nodes that can reach a final node (through productive calls); drops edges to the rest.
void trim(CompiledGrammar& cg) {
    size_t n = cg.nodes.size();
    std::vector<std::vector<int32_t>> rev_byte(n), rev_call(n), callers(cg.rule_start.size());
    for (size_t i = 0; i < n; ++i) {
        const Node& x = cg.nodes[i];
        for (uint32_t k = x.byte_begin; k < x.byte_end; ++k)
            rev_byte[size_t(cg.byte_edges[k].target)].push_back(int32_t(i));
        for (uint32_t k = x.call_begin; k < x.call_end; ++k) {
            rev_call[size_t(cg.call_edges[k].target)].push_back(int32_t(k));
            callers[size_t(cg.call_edges[k].rule)].push_back(int32_t(k));
        }
    }
    std::vector<int32_t> call_owner(cg.call_edges.size());
    for (size_t i = 0; i < n; ++i)
        for (uint32_t k = cg.nodes[i].call_begin; k < cg.nodes[i].call_end; ++k) call_owner[k] = int32_t(i);
    std::vector<char> live(n, 0);
    std::vector<int32_t> queue;
    auto make_live = [&](int32_t x) {
        if (!live[size_t(x)]) {
            live[size_t(x)] = 1;
            queue.push_back(x);
        }
    };
    for (size_t i = 0; i < n; ++i)
        if (cg.nodes[i].final) make_live(int32_t(i));
    while (!queue.empty()) {
        int32_t t = queue.back();
        queue.pop_back();
        for (int32_t x : rev_byte[size_t(t)]) make_live(x);
        for (int32_t k : rev_call[size_t(t)])
            if (live[size_t(cg.rule_start[size_t(cg.call_edges[size_t(k)].rule)])]) make_live(call_owner[size_t(k)]);
        int32_t r = cg.nodes[size_t(t)].rule;
        if (cg.rule_start[size_t(r)] == t)
            for (int32_t k : callers[size_t(r)])
                if (live[size_t(cg.call_edges[size_t(k)].target)]) make_live(call_owner[size_t(k)]);
    }
    if (!live[size_t(cg.rule_start[size_t(cg.root)])])
        fail("the grammar matches no string (rule '", cg.rule_names[size_t(cg.root)], "' never completes)");
    // Rebuild the edge arrays without edges to dead nodes or unproductive rules.
    std::vector<ByteEdge> bytes;
    std::vector<CallEdge> calls;
    for (Node& x : cg.nodes) {
        uint32_t b0 = uint32_t(bytes.size()), c0 = uint32_t(calls.size());
        for (uint32_t k = x.byte_begin; k < x.byte_end; ++k)
            if (live[size_t(cg.byte_edges[k].target)]) bytes.push_back(cg.byte_edges[k]);
        for (uint32_t k = x.call_begin; k < x.call_end; ++k) {
            const CallEdge& c = cg.call_edges[k];
            if (live[size_t(c.target)] && live[size_t(cg.rule_start[size_t(c.rule)])]) calls.push_back(c);
        }
        x.byte_begin = b0;
        x.byte_end = uint32_t(bytes.size());
        x.call_begin = c0;
        x.call_end = uint32_t(calls.size());
    }
    cg.byte_edges = std::move(bytes);
    cg.call_edges = std::move(calls);
}

// nullable[n]: the rule can complete from n without reading a byte.
std::vector<char> nullable_nodes(const CompiledGrammar& cg) {
    std::vector<char> nul(cg.nodes.size(), 0);
    for (size_t i = 0; i < cg.nodes.size(); ++i) nul[i] = cg.nodes[i].final;
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = cg.nodes.size(); i-- > 0;) {
            if (nul[i]) continue;
            const Node& x = cg.nodes[i];
            for (uint32_t k = x.call_begin; k < x.call_end && !nul[i]; ++k) {
                const CallEdge& c = cg.call_edges[k];
                if (nul[size_t(cg.rule_start[size_t(c.rule)])] && nul[size_t(c.target)]) nul[i] = changed = true;
            }
        }
    }
    return nul;
}

// A rule that can call itself before reading a byte would make closing a parser state loop
// forever; such grammars are refused.
void check_left_recursion(const CompiledGrammar& cg, const std::vector<char>& nul) {
    size_t nr = cg.rule_start.size();
    std::vector<std::vector<int32_t>> left(nr);
    for (size_t r = 0; r < nr; ++r) {
        std::vector<int32_t> stack{cg.rule_start[r]};
        std::vector<int32_t> seen{cg.rule_start[r]};
        while (!stack.empty()) {
            const Node& x = cg.nodes[size_t(stack.back())];
            stack.pop_back();
            for (uint32_t k = x.call_begin; k < x.call_end; ++k) {
                const CallEdge& c = cg.call_edges[k];
                left[r].push_back(c.rule);
                if (nul[size_t(cg.rule_start[size_t(c.rule)])] &&
                    std::find(seen.begin(), seen.end(), c.target) == seen.end()) {
                    seen.push_back(c.target);
                    stack.push_back(c.target);
                }
            }
        }
    }
    std::vector<char> color(nr, 0);  // 0 new, 1 on the DFS path, 2 done
    for (size_t s = 0; s < nr; ++s) {
        if (color[s]) continue;
        std::vector<std::pair<int32_t, size_t>> stack{{int32_t(s), 0}};
        color[s] = 1;
        while (!stack.empty()) {
            auto& [r, i] = stack.back();
            if (i == left[size_t(r)].size()) {
                color[size_t(r)] = 2;
                stack.pop_back();
                continue;
            }
            int32_t next = left[size_t(r)][i++];
            if (color[size_t(next)] == 1)
                fail("left recursion through rule '", cg.rule_names[size_t(next)],
                     "' (a rule reaches itself before reading any byte); rewrite it with repetition");
            if (color[size_t(next)] == 0) {
                color[size_t(next)] = 1;
                stack.emplace_back(next, 0);
            }
        }
    }
}

void compute_follow(CompiledGrammar& cg, const std::vector<char>& nul) {
    size_t n = cg.nodes.size();
    std::vector<ByteSet> first(n);
    for (size_t i = 0; i < n; ++i)
        for (uint32_t k = cg.nodes[i].byte_begin; k < cg.nodes[i].byte_end; ++k)
            first[i].set_range(cg.byte_edges[k].lo, cg.byte_edges[k].hi);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = n; i-- > 0;) {
            ByteSet f = first[i];
            for (uint32_t k = cg.nodes[i].call_begin; k < cg.nodes[i].call_end; ++k) {
                const CallEdge& c = cg.call_edges[k];
                f |= first[size_t(cg.rule_start[size_t(c.rule)])];
                if (nul[size_t(cg.rule_start[size_t(c.rule)])]) f |= first[size_t(c.target)];
            }
            if (!(f == first[i])) {
                first[i] = f;
                changed = true;
            }
        }
    }
    cg.follow.assign(cg.rule_start.size(), ByteSet{});
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < n; ++i) {
            for (uint32_t k = cg.nodes[i].call_begin; k < cg.nodes[i].call_end; ++k) {
                const CallEdge& c = cg.call_edges[k];
                ByteSet f = cg.follow[size_t(c.rule)];
                f |= first[size_t(c.target)];
                if (nul[size_t(c.target)]) f |= cg.follow[size_t(cg.nodes[i].rule)];
                if (!(f == cg.follow[size_t(c.rule)])) {
                    cg.follow[size_t(c.rule)] = f;
                    changed = true;
                }
            }
        }
    }
}

}  // namespace

CompiledGrammar compile_grammar(const Grammar& g, const CompileLimits& limits) {
    if (g.root < 0 || size_t(g.root) >= g.rules.size()) fail("the grammar has no root rule");
    CompiledGrammar cg;
    cg.root = g.root;
    size_t budget = limits.max_nfa_states;
    size_t edge_budget = limits.max_edges;
    for (size_t r = 0; r < g.rules.size(); ++r) {
        const Rule& rule = g.rules[r];
        if (rule.body < 0) fail("grammar rule '", rule.name, "' is referenced but never defined");
        NfaBuilder b(g, budget, rule.name);
        int start = b.state();
        int accept = b.build(rule.body, start);
        std::vector<LNode> nfa = remove_epsilon(b.states, start, accept, edge_budget, rule.name);
        std::vector<LNode> dfa;
        const std::vector<LNode>& chosen =
            determinize(nfa, nfa.size() * limits.max_dfa_factor + 16, limits.max_dfa_work, dfa) ? dfa : nfa;
        int32_t base = int32_t(cg.nodes.size());
        if (cg.nodes.size() + chosen.size() > limits.max_nodes)
            fail("grammar too large: over ", limits.max_nodes, " automaton nodes at rule '", rule.name, "'");
        cg.rule_start.push_back(base);
        cg.rule_names.push_back(rule.name);
        for (const LNode& x : chosen) {
            Node node;
            node.rule = int32_t(r);
            node.final = x.final;
            node.byte_begin = uint32_t(cg.byte_edges.size());
            for (auto& [set, t] : x.bytes) to_ranges(set, base + t, cg.byte_edges);
            node.byte_end = uint32_t(cg.byte_edges.size());
            node.call_begin = uint32_t(cg.call_edges.size());
            for (auto [callee, t] : x.calls) cg.call_edges.push_back(CallEdge{callee, base + t});
            node.call_end = uint32_t(cg.call_edges.size());
            cg.nodes.push_back(node);
        }
    }
    trim(cg);
    std::vector<char> nul = nullable_nodes(cg);
    check_left_recursion(cg, nul);
    compute_follow(cg, nul);
    compute_min_bytes(cg);
    return cg;
}

}  // namespace peregrine::grammar
