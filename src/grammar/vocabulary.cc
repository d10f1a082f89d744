#include "grammar/vocabulary.h"

#include <algorithm>

#include "core/error.h"

namespace peregrine::grammar {

TokenTrie::TokenTrie(const Vocabulary& v) : tokens_(&v.tokens) {
    PG_CHECK(v.special.empty() || v.special.size() == v.tokens.size());
    std::vector<int32_t> order;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
        bool special = !v.special.empty() && v.special[i];
        bool eos = std::find(v.eos.begin(), v.eos.end(), int32_t(i)) != v.eos.end();
        if (!special && !eos && !v.tokens[i].empty()) order.push_back(int32_t(i));
    }
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        const std::string &x = v.tokens[size_t(a)], &y = v.tokens[size_t(b)];
        return x != y ? x < y : a < b;
    });
    ids = order;
    std::vector<uint32_t> open;  // node index per depth-1 along the current path
    const std::string* prev = nullptr;
    for (size_t i = 0; i < order.size(); ++i) {
        const std::string& s = v.tokens[size_t(order[i])];
        if (s.size() > 65535) fail("token ", order[i], " is longer than 65535 bytes");
        size_t lcp = 0;
        if (prev)
            while (lcp < prev->size() && lcp < s.size() && (*prev)[lcp] == s[lcp]) ++lcp;
        if (prev && lcp == s.size() && lcp == prev->size()) {  // same bytes as the previous id
            nodes[open.back()].id_end = uint32_t(i + 1);
            continue;
        }
        while (open.size() > lcp) {
            nodes[open.back()].end = uint32_t(nodes.size());
            open.pop_back();
        }
        for (size_t d = lcp; d < s.size(); ++d) {
            open.push_back(uint32_t(nodes.size()));
            uint32_t at = d + 1 == s.size() ? uint32_t(i) : 0;
            nodes.push_back(TrieNode{0, at, d + 1 == s.size() ? uint32_t(i + 1) : 0, uint16_t(d + 1), uint8_t(s[d])});
        }
        max_depth = std::max(max_depth, s.size());
        prev = &s;
    }
    while (!open.empty()) {
        nodes[open.back()].end = uint32_t(nodes.size());
        open.pop_back();
    }
}

}  // namespace peregrine::grammar
