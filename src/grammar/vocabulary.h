// The tokenizer's vocabulary as plain data, and the byte trie over it that the token-mask code
// walks. Built by the caller from its tokenizer (each token's decoded bytes; which ids are
// special; which end the sequence), so this layer does not depend on the tokenizer class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace peregrine::grammar {

struct Vocabulary {
    std::vector<std::string> tokens;  // per id: the bytes the token decodes to
    std::vector<bool> special;        // per id (or empty): never allowed, EOS aside
    std::vector<int32_t> eos;         // ids allowed exactly when the grammar can end

    size_t size() const { return tokens.size(); }
    size_t mask_words() const { return (tokens.size() + 31) / 32; }
};

// The non-special, non-empty tokens as a trie in preorder (so in lexicographic byte order):
// node i reads byte `byte` at depth `depth` (1 = first byte); its subtree is [i, end). The ids
// whose bytes are exactly the path to node i are ids[id_begin, id_end) (several ids may decode
// to the same bytes, e.g. "A" and <0x41>).
class TokenTrie {
  public:
    struct TrieNode {
        uint32_t end;
        uint32_t id_begin, id_end;
        uint16_t depth;
        uint8_t byte;
    };
    explicit TokenTrie(const Vocabulary& v);

    std::vector<TrieNode> nodes;
    std::vector<int32_t> ids;
    size_t max_depth = 0;
    // The token bytes of a node that ends a token (ids non-empty).
    const std::string& text(uint32_t node) const { return (*tokens_)[size_t(ids[nodes[node].id_begin])]; }

  private:
    const std::vector<std::string>* tokens_;
};

// A vocabulary and its trie, built once per tokenizer and shared (read-only) by every grammar
// and matcher. Not movable: the trie points into the vocabulary.
struct VocabIndex {
    explicit VocabIndex(Vocabulary v) : vocab(std::move(v)), trie(vocab) {}
    VocabIndex(const VocabIndex&) = delete;
    VocabIndex& operator=(const VocabIndex&) = delete;

    const Vocabulary vocab;
    const TokenTrie trie;
};

}  // namespace peregrine::grammar
