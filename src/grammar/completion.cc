// The shortest completion of a grammar state (automaton.h: CompiledGrammar::min_bytes, and
// Parser::completion_bytes): what lets a matcher close a structure before a token budget ends.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/parser.h"

namespace peregrine::grammar {

// Shortest paths backwards from the final nodes, where a call edge n -> t through rule r costs
// the shortest sentence of r (its start node's distance) plus t's: a Dijkstra in which a call
// edge is relaxed once both its callee's start and its target are settled (Knuth's
// generalization to superior functions: every cost is a sum of non-negative settled values, so
// popping in order of distance stays exact).
void compute_min_bytes(CompiledGrammar& cg) {
    const size_t n = cg.nodes.size();
    std::vector<int32_t> dist(n, kNoCompletion);
    std::vector<char> settled(n, 0);
    std::vector<std::vector<int32_t>> byte_preds(n);                                      // target -> sources
    std::vector<std::vector<std::pair<int32_t, int32_t>>> call_preds(n);                  // target -> (source, rule)
    std::vector<std::vector<std::pair<int32_t, int32_t>>> callers(cg.rule_start.size());  // rule -> (source, target)
    for (size_t i = 0; i < n; ++i) {
        const Node& node = cg.nodes[i];
        for (uint32_t e = node.byte_begin; e < node.byte_end; ++e)
            byte_preds[size_t(cg.byte_edges[e].target)].push_back(int32_t(i));
        for (uint32_t e = node.call_begin; e < node.call_end; ++e) {
            const CallEdge& c = cg.call_edges[e];
            call_preds[size_t(c.target)].emplace_back(int32_t(i), c.rule);
            callers[size_t(c.rule)].emplace_back(int32_t(i), c.target);
        }
    }
    using Item = std::pair<int32_t, int32_t>;  // (distance, node)
    std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
    auto relax = [&](int32_t node, int64_t d) {
        if (d < dist[size_t(node)]) {
            dist[size_t(node)] = int32_t(d);
            queue.emplace(int32_t(d), node);
        }
    };
    for (size_t i = 0; i < n; ++i)
        if (cg.nodes[i].final) relax(int32_t(i), 0);
    auto rule_min = [&](int32_t rule) {
        const int32_t start = cg.rule_start[size_t(rule)];
        return settled[size_t(start)] ? dist[size_t(start)] : kNoCompletion;
    };
    while (!queue.empty()) {
        const auto [d, node] = queue.top();
        queue.pop();
        if (settled[size_t(node)] || d != dist[size_t(node)]) continue;
        settled[size_t(node)] = 1;
        for (int32_t p : byte_preds[size_t(node)]) relax(p, int64_t(d) + 1);
        for (auto [p, rule] : call_preds[size_t(node)])
            if (rule_min(rule) < kNoCompletion) relax(p, int64_t(rule_min(rule)) + d);
        const int32_t rule = cg.nodes[size_t(node)].rule;
        if (cg.rule_start[size_t(rule)] == node)
            for (auto [p, target] : callers[size_t(rule)])
                if (settled[size_t(target)]) relax(p, int64_t(d) + dist[size_t(target)]);
    }
    cg.min_bytes = std::move(dist);
}

int32_t Parser::completion_bytes() const {
    if (at_end()) return 0;
    int32_t best = kNoCompletion;
    for (const Top& t : tops()) {
        const int64_t d = int64_t(g_.min_bytes[size_t(t.node)]) + (t.frame >= 0 ? frame_need_[size_t(t.frame)] : 0);
        if (d < best) best = int32_t(d);
    }
    return best;
}

}  // namespace peregrine::grammar
