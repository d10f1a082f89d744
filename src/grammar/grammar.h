// The grammar representation every front end compiles into: a context-free grammar over bytes.
//
// A Grammar is a list of named rules; each rule's body is an expression tree held in one flat
// arena (`exprs`, children by index, so subtrees may be shared). Leaves are byte sets (one
// byte of input from a 256-bit set) and references to rules; inner nodes are sequences,
// alternatives and bounded or unbounded repetition. Characters above ASCII are spelled as the
// UTF-8 byte sequences they encode to (utf8.h), so the matcher only ever sees bytes.
//
// One construct is specific to JSON objects: `Subset`, items in a fixed order of which each may
// be required or optional, joined by a separator, optionally followed by any number of `tail`
// items (additional properties). Spelled with plain alternatives it is quadratic (or, nested,
// exponential); the automaton builder (automaton.cc) compiles it in linear size.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine::grammar {

// A set of bytes, 4 x 64 bits.
struct ByteSet {
    std::array<uint64_t, 4> bits{};
    void set(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
    void set_range(uint8_t lo, uint8_t hi) {
        for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
    }
    bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
    bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
    ByteSet& operator|=(const ByteSet& o) {
        for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
        return *this;
    }
    bool operator==(const ByteSet&) const = default;
};

// Unbounded repetition's upper bound.
inline constexpr int kUnbounded = -1;

struct Expr {
    enum class Kind : uint8_t {
        Empty,   // matches the empty string
        Bytes,   // one byte from `bytes`
        Seq,     // children in order
        Alt,     // any one child
        Ref,     // the rule `rule`
        Repeat,  // child[0] repeated min..max times (max may be kUnbounded)
        Subset,  // see the header comment: children = items, `required` per item,
                 // `sep` between items, `tail` (or -1) repeatable after them
    };
    Kind kind = Kind::Empty;
    ByteSet bytes;
    int rule = -1;
    int min = 0, max = 0;
    int sep = -1, tail = -1;
    std::vector<int> children;
    std::vector<bool> required;
};

struct Rule {
    std::string name;
    int body = -1;  // an index into Grammar::exprs; -1 while the rule is declared but not defined
};

// Builds expressions; every helper returns the new expression's index.
class Grammar {
  public:
    std::vector<Expr> exprs;
    std::vector<Rule> rules;
    int root = -1;  // the rule the input must match as a whole

    int empty();
    int bytes(const ByteSet& set);
    int byte_range(uint8_t lo, uint8_t hi);
    int literal(std::string_view text);  // the exact bytes of `text`
    int seq(std::vector<int> items);
    int alt(std::vector<int> items);
    int ref(int rule);
    int repeat(int item, int min, int max);
    int star(int item) { return repeat(item, 0, kUnbounded); }
    int plus(int item) { return repeat(item, 1, kUnbounded); }
    int opt(int item) { return repeat(item, 0, 1); }
    int subset(std::vector<int> items, std::vector<bool> required, int sep, int tail);

    // A new rule (body unset); find_rule returns -1 when there is none of that name.
    int add_rule(std::string name, int body = -1);
    int find_rule(std::string_view name) const;

    // Human-readable EBNF-like text, for tests and error messages.
    std::string to_string() const;

  private:
    std::string expr_to_string(int e) const;
};

}  // namespace peregrine::grammar
