// The token budget (GrammarMatcher::fill_next_token_bitmask's tokens_left): near the end of
// max_tokens a token is allowed only when the shortest completion after it (bytes, an upper
// bound on tokens) plus the EOS still fits. Checked against a brute-force oracle (every token
// fed to the state, then a breadth-first search over bytes for the shortest completion) at
// budgets of 1, 2, 5 tokens and around the need, inside a string, an array, an object and a
// number; with room the mask is exactly the unbudgeted one; exclusive numeric bounds hold for
// every completion.
#include <deque>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar_test_util.h"
#include "hf_vocab.h"
#include "support/sanitized.h"

namespace peregrine::grammar {
namespace {

using testing::allowed;

using testing::llama3_index;
using testing::stories_index;
using testing::tokenized;

// The parser state after `text` as a comparable key (tops and end flag); frames are interned
// per parser, so keys compare only within one parser.
std::vector<int64_t> state_key(const Parser& p) {
    std::vector<int64_t> k;
    for (const Top& t : p.tops()) k.push_back(int64_t(t.node) << 32 | uint32_t(t.frame));
    std::sort(k.begin(), k.end());
    k.push_back(p.at_end());
    return k;
}

// Shortest completion of `text` in bytes by breadth-first search over bytes (states merged by
// key); -1 when `text` is not a prefix, or none within `cap` bytes.
int oracle_need(const CompiledGrammar& cg, const std::string& text, int cap = 80) {
    Parser p(cg);
    for (char c : text)
        if (!p.advance(uint8_t(c))) return -1;
    const size_t base = p.num_steps();
    std::set<std::vector<int64_t>> seen{state_key(p)};
    std::deque<std::string> queue{""};
    while (!queue.empty()) {
        const std::string s = queue.front();
        queue.pop_front();
        p.truncate(base);
        for (char c : s) p.advance(uint8_t(c));
        if (p.at_end()) return int(s.size());
        if (int(s.size()) >= cap) continue;
        const size_t here = p.num_steps();
        for (int b = 0; b < 256; ++b) {
            p.truncate(here);
            if (!p.advance(uint8_t(b))) continue;
            if (seen.insert(state_key(p)).second) queue.push_back(s + char(b));
        }
    }
    return -1;
}

// The parser's own shortest completion (completion.cc) of `text`, -1 when not a prefix.
int parser_need(const CompiledGrammar& cg, const std::string& text) {
    Parser p(cg);
    for (char c : text)
        if (!p.advance(uint8_t(c))) return -1;
    return p.completion_bytes();
}

// Per token the unbudgeted mask allows after `prefix` (EOS aside): the need after it. The
// breadth-first oracle's when `bfs` (and the parser's completion_bytes must equal it), else the
// parser's (a large vocabulary).
std::map<int32_t, int> needs_after(const std::shared_ptr<const TokenizedGrammar>& tg, const std::string& prefix,
                                   bool bfs) {
    const Vocabulary& v = tg->vocab().vocab;
    GrammarMatcher m(tg);
    EXPECT_TRUE(m.accept_string(prefix)) << prefix;
    std::vector<uint32_t> full(v.mask_words());
    m.fill_next_token_bitmask(full);  // exact (token_mask_test)
    Parser p(tg->grammar());
    for (char c : prefix) p.advance(uint8_t(c));
    const size_t base = p.num_steps();
    std::map<int32_t, int> need;
    for (int32_t id = 0; id < int32_t(v.size()); ++id) {
        if (std::find(v.eos.begin(), v.eos.end(), id) != v.eos.end() || !allowed(full, id)) continue;
        p.truncate(base);
        for (char c : v.tokens[size_t(id)]) EXPECT_TRUE(p.advance(uint8_t(c)));
        need[id] = p.completion_bytes();
        if (bfs) {
            EXPECT_EQ(oracle_need(tg->grammar(), prefix + v.tokens[size_t(id)]), need[id]) << id;
        }
    }
    return need;
}

// The budgeted mask after `prefix` with `tokens_left`, checked token by token: allowed = EOS
// when complete, and the tokens whose need after them fits in tokens_left - 2 bytes (or, when
// none does, those of the least need). Returns how many tokens the budget took away.
int expect_budget_exact(const std::shared_ptr<const TokenizedGrammar>& tg, const std::string& prefix,
                        const std::map<int32_t, int>& need, int64_t tokens_left) {
    const Vocabulary& v = tg->vocab().vocab;
    GrammarMatcher m(tg);
    EXPECT_TRUE(m.accept_string(prefix)) << prefix;
    std::vector<uint32_t> full(v.mask_words()), mask(v.mask_words());
    m.fill_next_token_bitmask(full);
    const bool narrowed = m.fill_next_token_bitmask(mask, tokens_left);
    int64_t limit = tokens_left - 2;
    bool any = false;
    for (const auto& [id, n] : need) any |= n <= limit;
    const bool complete = m.is_completed();
    if (!any && !complete) {
        limit = INT64_MAX;
        for (const auto& [id, n] : need) limit = std::min<int64_t>(limit, n);
    }
    int removed = 0;
    for (int32_t id = 0; id < int32_t(v.size()); ++id) {
        const bool eos = std::find(v.eos.begin(), v.eos.end(), id) != v.eos.end();
        const auto it = need.find(id);
        const bool want = eos ? complete : it != need.end() && it->second <= limit;
        if (allowed(mask, id) != want)
            ADD_FAILURE() << "'" << prefix << "' + '" << v.tokens[size_t(id)] << "' ("
                          << (it != need.end() ? it->second : -1) << " bytes after), " << tokens_left
                          << " tokens left: allowed " << allowed(mask, id);
        removed += allowed(full, id) && !allowed(mask, id);
    }
    EXPECT_EQ(narrowed, removed > 0) << prefix << ", " << tokens_left;
    return removed;
}

const char* kSchema = R"({"type": "object", "properties": {
    "name": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "size": {"type": "object", "properties": {"w": {"type": "integer"}, "note": {"type": "string"}},
             "required": ["w"]},
    "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 5}},
  "required": ["name", "tags", "size", "x"], "additionalProperties": false})";

// Inside a string, an array, an object and a number, at 1, 2 and 5 tokens left and around the
// need of the state (where the budget starts to bite), on both vocabularies (under the
// sanitizers the small one: the exact oracle over 128K tokens took 149 s there).
TEST(GrammarBudget, MaskIsExactAtTightBudgets) {
    const char* prefixes[] = {
        R"({"name": "Once up)",                                         // a string
        R"({"name": "a", "tags": ["x")",                                // an array, between items
        R"({"name": "a", "tags": ["x"], "size": {"w": 3)",              // an object, optional member next
        R"({"name": "a", "tags": ["x"], "size": {"w": 3, "note": "a)",  // a string in a nested object
        R"({"name": "a", "tags": ["x"], "size": {"w": 3}, "x": 0.0)",   // a number (exclusiveMinimum 0)
        R"({"name": "a", "tags": ["x"], "size": {"w": 3}, "x": 4.99)",  // (exclusiveMaximum 5)
    };
    for (const auto& vocab : {stories_index(), llama3_index()}) {
        if (kUnderSanitizer && vocab == llama3_index()) continue;
        const bool small = vocab == stories_index();
        auto tg = tokenized(compile_json_schema_text(kSchema), vocab);
        int removed = 0;
        for (const char* prefix : prefixes) {
            const int need = oracle_need(tg->grammar(), prefix);
            ASSERT_GT(need, 0) << prefix;
            ASSERT_EQ(parser_need(tg->grammar(), prefix), need) << prefix;
            const std::map<int32_t, int> after = needs_after(tg, prefix, small);
            for (int64_t left : {int64_t(1), int64_t(2), int64_t(5), int64_t(need), int64_t(need) + 1,
                                 int64_t(need) + 2, int64_t(need) + 3, int64_t(need) + 8}) {
                SCOPED_TRACE(std::string(prefix) + " with " + std::to_string(left) + " tokens left");
                removed += expect_budget_exact(tg, prefix, after, left);
            }
        }
        EXPECT_GT(removed, 0);  // the budget did bite somewhere
    }
    // Multi-byte tokens stay allowed while they fit: inside a string with need + 2 tokens left,
    // every content token of Llama 3 (after it the need is the same) is allowed, only the tokens
    // that need more (an escape, a closing quote that opens another member) are not; with
    // need + 1, the tokens that shorten the rest, some of them multi-byte.
    auto tg = tokenized(compile_json_schema_text(kSchema), llama3_index());
    const Vocabulary& v = llama3_index()->vocab;
    const std::string prefix = R"({"name": "a", "tags": ["x"], "size": {"w": 3, "note": "a)";
    const int need = parser_need(tg->grammar(), prefix);
    GrammarMatcher m(tg);
    ASSERT_TRUE(m.accept_string(prefix));
    std::vector<uint32_t> full(v.mask_words()), mask(v.mask_words());
    m.fill_next_token_bitmask(full);
    auto count = [&](const std::vector<uint32_t>& mk, bool multi_only) {
        int n = 0;
        for (int32_t id = 0; id < int32_t(v.size()); ++id)
            n += allowed(mk, id) && (!multi_only || v.tokens[size_t(id)].size() > 1);
        return n;
    };
    m.fill_next_token_bitmask(mask, need + 2);
    const int plain = count(full, false);
    EXPECT_GT(count(mask, true), plain * 9 / 10) << plain;
    EXPECT_TRUE(m.fill_next_token_bitmask(mask, need + 1));
    EXPECT_GT(count(mask, true), 0);
    EXPECT_LT(count(mask, false), 1000);
}

// With room (the budget above every allowed token's need), the mask is the unbudgeted one, bit
// for bit, and the call says it narrowed nothing: along random walks of the corpus-like schema
// with a generous budget, on Llama 3 (multi-byte tokens).
TEST(GrammarBudget, RoomLeavesTheMaskUntouched) {
    for (const auto& vocab : {stories_index(), llama3_index()}) {
        auto tg = tokenized(compile_json_schema_text(kSchema), vocab);
        const Vocabulary& v = vocab->vocab;
        std::mt19937 rng(5);
        for (int walk = 0; walk < full_or_sanitized(6, 2); ++walk) {
            GrammarMatcher m(tg);
            std::vector<uint32_t> full(v.mask_words()), mask(v.mask_words());
            for (int step = 0; step < 60 && !m.is_terminated(); ++step) {
                m.fill_next_token_bitmask(full);
                EXPECT_FALSE(m.fill_next_token_bitmask(mask, 1000));
                ASSERT_EQ(mask, full) << "step " << step;
                std::vector<int32_t> ids;
                for (size_t w = 0; w < full.size(); ++w)
                    for (uint32_t b = full[w]; b; b &= b - 1) ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(b))));
                ASSERT_FALSE(ids.empty());
                ASSERT_TRUE(m.accept_token(ids[rng() % ids.size()]));
            }
        }
    }
}

// A budget that fits the shortest document from the start always ends, with EOS, within it,
// whatever is drawn (uniformly from the mask): at exactly the shortest document + EOS, and with
// a few tokens to spare; the document is valid.
TEST(GrammarBudget, UniformWalksEndWithinTheBudget) {
    auto tg = tokenized(compile_json_schema_text(kSchema), stories_index());
    const Vocabulary& v = tg->vocab().vocab;
    const int shortest = oracle_need(tg->grammar(), "");
    ASSERT_GT(shortest, 0);
    EXPECT_EQ(parser_need(tg->grammar(), ""), shortest);
    std::mt19937 rng(9);
    for (int64_t budget : {int64_t(shortest) + 1, int64_t(shortest) + 3, int64_t(shortest) + 20}) {
        for (int walk = 0; walk < 20; ++walk) {
            GrammarMatcher m(tg);
            std::vector<uint32_t> mask(v.mask_words());
            std::string text;
            int64_t used = 0;
            for (; used < budget && !m.is_terminated(); ++used) {
                m.fill_next_token_bitmask(mask, budget - used);
                std::vector<int32_t> ids;
                for (size_t w = 0; w < mask.size(); ++w)
                    for (uint32_t b = mask[w]; b; b &= b - 1) ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(b))));
                ASSERT_FALSE(ids.empty()) << text;
                const int32_t pick = ids[rng() % ids.size()];
                ASSERT_TRUE(m.accept_token(pick));
                if (!m.is_terminated()) text += v.tokens[size_t(pick)];
            }
            ASSERT_TRUE(m.is_terminated()) << "budget " << budget << ": " << text;
            const auto j = nlohmann::ordered_json::parse(text);
            EXPECT_EQ(testing::check_schema(j, nlohmann::ordered_json::parse(kSchema),
                                            nlohmann::ordered_json::parse(kSchema)),
                      "")
                << text;
        }
    }
}

// Exclusive bounds hold for the value as a double (what validators compare), for every
// completion the grammar allows: the shortest ones (what a budget closes with) and long ones.
TEST(GrammarBudget, ExclusiveBoundsHoldAsDoubles) {
    struct Case {
        const char* schema;
        std::vector<std::string> bad;  // texts that read as a double outside the bounds
    };
    const Case cases[] = {
        {R"({"type": "number", "exclusiveMinimum": 0})", {"0", "0.0", "0.000"}},
        {R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})", {"0.99999999999999999", "0", "1"}},
        {R"({"type": "number", "exclusiveMaximum": 5})", {"4.99999999999999999", "5"}},
        {R"({"type": "number", "exclusiveMinimum": -3, "maximum": 0})", {"-2.99999999999999999", "-3"}},
        {R"({"type": "number", "exclusiveMaximum": 0})", {"0", "0.0"}},
        {R"({"type": "number", "minimum": 100, "exclusiveMaximum": 1000})", {"999.99999999999999", "1000"}},
        {R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})", {"0", "10", "1.5"}},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.schema);
        const auto schema = nlohmann::ordered_json::parse(c.schema);
        const CompiledGrammar cg = compile_grammar(compile_json_schema(schema));
        for (const std::string& b : c.bad) EXPECT_FALSE(testing::full_match(cg, b)) << b;
        // Every allowed text up to a length, enumerated breadth-first over the bytes of numbers.
        std::deque<std::string> queue{""};
        int checked = 0;
        while (!queue.empty()) {
            const std::string s = queue.front();
            queue.pop_front();
            if (testing::full_match(cg, s)) {
                ++checked;
                EXPECT_EQ(testing::check_schema(nlohmann::ordered_json::parse(s), schema, schema), "") << s;
            }
            if (s.size() >= size_t(full_or_sanitized(6, 5))) continue;
            for (char b : std::string("-.0123459")) {
                Parser p(cg);
                bool ok = true;
                for (char x : s + b) ok = ok && p.advance(uint8_t(x));
                if (ok) queue.push_back(s + b);
            }
        }
        EXPECT_GT(checked, 5);
        // The shortest completions of long prefixes next to the bounds are in range too.
        auto tg = tokenized(compile_json_schema(schema), stories_index());
        for (const std::string prefix :
             {"0.0000000", "4.9999999", "-2.9999999", "0.9999999", "-0.0000000", "999.99999"}) {
            Parser p(cg);
            bool ok = true;
            for (char x : prefix) ok = ok && p.advance(uint8_t(x));
            if (!ok) continue;
            // Close with the budget: 1 + need tokens left, the least it can.
            GrammarMatcher m(tg);
            ASSERT_TRUE(m.accept_string(prefix));
            const Vocabulary& v = tg->vocab().vocab;
            std::vector<uint32_t> mask(v.mask_words());
            std::string text = prefix;
            for (int64_t left = p.completion_bytes() + 1; left > 0 && !m.is_terminated(); --left) {
                m.fill_next_token_bitmask(mask, left);
                int32_t pick = -1;
                for (int32_t id = int32_t(v.size()) - 1; id >= 0 && pick < 0; --id)
                    if (allowed(mask, id)) pick = id;
                ASSERT_GE(pick, 0) << text;
                ASSERT_TRUE(m.accept_token(pick));
                if (!m.is_terminated()) text += v.tokens[size_t(pick)];
            }
            ASSERT_TRUE(m.is_terminated()) << text;
            EXPECT_EQ(testing::check_schema(nlohmann::ordered_json::parse(text), schema, schema), "") << text;
        }
    }
}

}  // namespace
}  // namespace peregrine::grammar
