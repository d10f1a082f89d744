// Runs a CompiledGrammar as a pushdown automaton over bytes, one step per byte, with every
// step kept so that the state can be rolled back to any earlier byte in O(1).
//
// Why a pushdown automaton with a graph-structured stack rather than Earley: rules are small
// automata (automaton.h), so a parse position is "a node plus the stack of return nodes"; the
// grammars we build are mostly deterministic, so a state holds a handful of stacks, each step is
// a few edge lookups, and (unlike Earley items) a stack top names one rule position, which is
// exactly the key for the context-independent token cache (token_cache.h). Left recursion is
// refused at compile time instead (llama.cpp's GBNF refuses it too).
//
// Shapes: a state (step) is a set of Tops {node, frame}: `node` is a node with byte edges (a
// place where the next byte is read), `frame` the caller stack: an index into `frames_`, each
// frame {return node, parent frame}, -1 the bottom. Frames are hash-consed, so equal stacks are
// the same index and duplicate tops collapse. Frames are never freed while the parser lives
// (their count is bounded by the distinct call stacks seen; reset() drops them).
// A step also records `end`: some stack completed the start rule (for the matcher, the input is
// a complete sentence; for the token cache's local walk, the rule was left).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "grammar/automaton.h"

namespace peregrine::grammar {

struct Top {
    int32_t node;
    int32_t frame;
};

class Parser {
  public:
    explicit Parser(const CompiledGrammar& g);

    // Drops every step and frame; step 0 becomes the closure of `node` on an empty stack.
    void reset(int32_t node);
    // Reads one byte: pushes a new step and returns true when some stack can read it (or it
    // completes the start rule), else returns false and leaves the state as it was.
    bool advance(uint8_t b);
    // Back to `num_steps` steps (1 = only the initial step).
    void truncate(size_t num_steps);

    size_t num_steps() const { return step_begin_.size(); }
    std::span<const Top> tops() const { return {tops_.data() + step_begin_.back(), tops_.size() - step_begin_.back()}; }
    bool at_end() const { return step_end_.back() != 0; }
    // The fewest bytes after which the input can be a complete sentence of the start rule: 0 at
    // the end, else the least over the tops of the node's min_bytes plus its stack's (exact:
    // a stack completes by completing each frame's rule in turn). completion.cc.
    int32_t completion_bytes() const;
    // The bytes that complete every frame of a stack in turn (0 for the bottom, -1).
    int32_t frame_need(int32_t frame) const { return frame < 0 ? 0 : frame_need_[size_t(frame)]; }

  private:
    void close(int32_t node, int32_t frame);
    int32_t intern_frame(int32_t node, int32_t parent);

    const CompiledGrammar& g_;
    std::vector<Top> frames_;          // {return node, parent}
    std::vector<int32_t> frame_need_;  // per frame: min_bytes of its return node plus its parent's
    // Open-addressing map (return node, parent) -> frame index; keys 0 are free slots.
    std::vector<uint64_t> frame_keys_;
    std::vector<int32_t> frame_vals_;
    std::vector<Top> tops_;  // every step's tops, concatenated
    std::vector<uint32_t> step_begin_;
    std::vector<uint8_t> step_end_;
    // Scratch for close(): the (node, frame) pairs visited in this step.
    std::vector<uint64_t> seen_;
    std::vector<uint64_t> seen_slots_;
    std::vector<Top> work_;
};

}  // namespace peregrine::grammar
