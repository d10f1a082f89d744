// The compiled grammar: one finite automaton per rule, whose edges read a byte range or call a
// rule (a pushdown automaton as a whole; parser.h runs it). Built from a Grammar by
// compile_grammar: Thompson construction per rule (the Subset construct in linear size),
// epsilon removal, subset construction to a DFA where that stays small (else the epsilon-free
// NFA is kept), then dead-node trimming and the checks the matcher relies on.
//
// Invariants after compile_grammar (the parser and the token-mask cache rely on them):
//   - every rule is productive (derives at least one finite string) and every node can reach
//     a final node of its rule, so any state the parser reaches can still complete;
//   - no rule is left-recursive (directly, mutually, or behind nullable prefixes), so closing a
//     state over calls always terminates;
//   - sizes are capped (CompileLimits): over a cap compile_grammar throws Error quickly.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace peregrine::grammar {

struct CompileLimits {
    size_t max_nfa_states = 200000;  // epsilon-NFA states over all rules (bounds work and memory)
    size_t max_nodes = 100000;       // nodes of the final automaton
    size_t max_edges = 4000000;      // edges after epsilon removal, over all rules
    size_t max_dfa_factor = 4;       // a rule's DFA may be this many times its NFA (else NFA kept)
    size_t max_dfa_work = 64000000;  // per rule: subset-construction work (else the NFA is kept)
};

struct ByteEdge {
    uint8_t lo, hi;  // inclusive
    int32_t target;  // node
};

struct CallEdge {
    int32_t rule;
    int32_t target;  // the node to continue at once the called rule completes
};

struct Node {
    uint32_t byte_begin = 0, byte_end = 0;  // [begin, end) into CompiledGrammar::byte_edges
    uint32_t call_begin = 0, call_end = 0;  // into CompiledGrammar::call_edges
    int32_t rule = -1;
    bool final = false;  // the rule may complete here
};

struct CompiledGrammar {
    std::vector<Node> nodes;
    std::vector<ByteEdge> byte_edges;
    std::vector<CallEdge> call_edges;
    std::vector<int32_t> rule_start;  // per rule: its start node
    std::vector<std::string> rule_names;
    // Per rule: the bytes that may come right after it completes (the FOLLOW set); empty for the
    // root, after which only EOS may come. Lets the token cache reject tokens that leave a rule
    // into a byte no caller accepts, without knowing the caller.
    std::vector<ByteSet> follow;
    // Per node: the fewest bytes that take it to a final node of its rule (a call counted at its
    // rule's shortest sentence); what the matcher's token budget is checked against.
    std::vector<int32_t> min_bytes;
    int32_t root = -1;

    bool has_bytes(int32_t n) const { return nodes[size_t(n)].byte_begin != nodes[size_t(n)].byte_end; }
};

// Throws Error for an undefined rule, left recursion, a grammar (or root) that matches nothing,
// or a size over `limits`.
CompiledGrammar compile_grammar(const Grammar& g, const CompileLimits& limits = {});
// Fills cg.min_bytes (completion.cc); compile_grammar calls it.
void compute_min_bytes(CompiledGrammar& cg);

// A completion length that stands for "none" (never left after trimming) and caps sums.
inline constexpr int32_t kNoCompletion = INT32_MAX / 4;

}  // namespace peregrine::grammar
