// Lookup tables shared by the tokenizer's encoder and its loaders (not a public header).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace peregrine {

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// (left id, right id) → (rank, merged id), open addressing with linear probing.
class PairTable {
  public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap <<= 1;
        keys_.assign(cap, kEmpty);
        vals_.assign(cap, 0);
        mask_ = cap - 1;
        size_ = 0;
    }
    size_t size() const { return size_; }
    // Keeps the first value given for a key (the lowest rank).
    void insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
        if ((size_ + 1) * 2 > keys_.size()) grow();
        put(key(left, right),
            (static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 32) | static_cast<uint32_t>(merged));
    }
    // The rank of the pair, -1 when it does not merge.
    int32_t find(int32_t left, int32_t right, int32_t* merged) const {
        if (keys_.empty()) return -1;
        const uint64_t k = key(left, right);
        for (size_t i = slot(k);; i = (i + 1) & mask_) {
            if (keys_[i] == k) {
                *merged = static_cast<int32_t>(vals_[i] & 0xffffffffu);
                return static_cast<int32_t>(vals_[i] >> 32);
            }
            if (keys_[i] == kEmpty) return -1;
        }
    }

  private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t key(int32_t l, int32_t r) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
    }
    size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
    void put(uint64_t k, uint64_t v) {
        for (size_t i = slot(k);; i = (i + 1) & mask_) {
            if (keys_[i] == k) return;
            if (keys_[i] == kEmpty) {
                keys_[i] = k;
                vals_[i] = v;
                ++size_;
                return;
            }
        }
    }
    void grow() {
        std::vector<uint64_t> ok = std::move(keys_), ov = std::move(vals_);
        reserve(ok.empty() ? 16 : ok.size());
        for (size_t i = 0; i < ok.size(); ++i)
            if (ok[i] != kEmpty) put(ok[i], ov[i]);
    }
    std::vector<uint64_t> keys_, vals_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

struct Tokenizer::Index {
    StringMap<int32_t> tokens;  // vocabulary entry or added token → id
    StringMap<int32_t> model;   // what BPE looks text up in: raw bytes (byte-level) or entries
    PairTable merges;
};

// Builds a Tokenizer field by field (the loaders for tokenizer.json and GGUF).
class TokenizerBuilder {
  public:
    static Tokenizer from_json(const std::string& path);
    static Tokenizer from_gguf(const GgufFile& gguf);
};

}  // namespace peregrine
