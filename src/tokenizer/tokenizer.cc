// Encoding and decoding; the loaders are in tokenizer_load.cc.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

namespace peregrine {

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Words up to this size are remembered within one encode() call.
constexpr size_t kMaxCachedWord = 128;

}  // namespace

// Per-call scratch: nothing here outlives one encode(), so a Tokenizer stays immutable.
struct Tokenizer::EncodeState {
    std::string normalized;  // the stretch after the normalizer
    std::string escaped;     // after the space prefix / replacement
    std::vector<std::string_view> words;

    struct Symbol {
        int32_t id;  // token id (rank merges); -1 once merged into its left neighbour
        int32_t prev, next;
        uint32_t start;  // byte span in the word
        uint32_t len;    // 0 once merged away (score merges)
    };
    struct Candidate {
        double priority;  // higher first: -rank, or the SentencePiece score
        int32_t left, right;
        int32_t left_id, right_id;  // rank merges: the ids the pair had when queued
        uint32_t size;              // score merges: the bytes the pair covered
        int32_t merged = -1;        // rank merges: the id the pair merges into
        bool operator<(const Candidate& o) const {
            return priority < o.priority || (priority == o.priority && left > o.left);
        }
    };
    std::vector<Symbol> syms;
    std::vector<Candidate> heap;
    std::vector<int32_t> word_ids;

    StringMap<uint64_t> cache;  // word → (offset << 32 | count) into pool
    std::vector<int32_t> pool;
};

Tokenizer::Tokenizer() : index_(std::make_unique<Index>()) {
    byte_ids_.fill(-1);
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

bool Tokenizer::is_special(int32_t id) const {
    if (!valid_id(id)) return false;
    const TokenType t = types_[id];
    return t == TokenType::Control || t == TokenType::Unknown || t == TokenType::Unused;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
    auto it = index_->tokens.find(token);
    return it == index_->tokens.end() ? -1 : it->second;
}

int32_t Tokenizer::model_lookup(std::string_view s) const {
    auto it = index_->model.find(s);
    return it == index_->model.end() ? -1 : it->second;
}

int32_t Tokenizer::pair_lookup(int32_t left, int32_t right, int32_t* merged) const {
    return index_->merges.find(left, right, merged);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens, bool parse_special) const {
    std::string clean;
    if (!utf8::is_valid(text)) {
        clean = utf8::sanitize(text);
        text = clean;
    }
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 8);
    if (add_special_tokens) out = prefix_ids_;
    EncodeState st;

    // Cut out added tokens, leftmost first and longest at a position.
    size_t stretch = 0;
    if (parse_special ? !added_.empty() : has_user_defined_) {
        const size_t n = text.size();
        for (size_t i = 0; i < n;) {
            const auto& cands = added_by_byte_[static_cast<unsigned char>(text[i])];
            const AddedToken* hit = nullptr;
            for (int32_t k : cands) {
                const AddedToken& t = added_[k];
                if (t.special && !parse_special) continue;
                if (text.compare(i, t.content.size(), t.content) == 0) {
                    hit = &t;
                    break;
                }
            }
            if (!hit) {
                ++i;
                continue;
            }
            size_t a = i, b = i + hit->content.size();
            if (hit->lstrip)
                while (a > stretch && is_space(text[a - 1])) --a;
            if (hit->rstrip)
                while (b < n && is_space(text[b])) ++b;
            if (a > stretch) encode_stretch(text.substr(stretch, a - stretch), stretch == 0, st, out);
            out.push_back(hit->id);
            stretch = i = b;
        }
    }
    if (stretch < text.size()) encode_stretch(text.substr(stretch), stretch == 0, st, out);
    if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
    return out;
}

void Tokenizer::encode_stretch(std::string_view text, bool at_start, EncodeState& st, std::vector<int32_t>& out) const {
    std::string_view s = text;
    if (!normalizer_.empty()) {
        std::string cur(s), next;
        for (const NormalizerStep& step : normalizer_) {
            switch (step.op) {
                case NormalizerStep::Op::Normalize:
                    cur = utf8::normalize(cur, step.form);
                    break;
                case NormalizerStep::Op::Prepend:
                    if (!cur.empty()) cur.insert(0, step.a);
                    break;
                case NormalizerStep::Op::Replace:
                    if (step.a.empty()) break;
                    next.clear();
                    for (size_t i = 0; i < cur.size();) {
                        if (cur.compare(i, step.a.size(), step.a) == 0) {
                            next += step.b;
                            i += step.a.size();
                        } else {
                            next += cur[i++];
                        }
                    }
                    cur.swap(next);
                    break;
            }
        }
        st.normalized = std::move(cur);
        s = st.normalized;
    }
    if (s.empty()) return;

    if (kind_ == TokenizerKind::ByteLevelBpe) {
        if (byte_level_prefix_space_ && s[0] != ' ') {
            st.escaped.assign(1, ' ');
            st.escaped += s;
            s = st.escaped;
        }
    } else if (!space_replacement_.empty()) {
        const std::string& rep = space_replacement_;
        const bool has_prefix = s[0] == ' ' || s.starts_with(rep);
        bool prefix = false;
        switch (space_prefix_) {
            case SpacePrefix::Never:
                break;
            case SpacePrefix::Always:
                prefix = true;
                break;
            case SpacePrefix::AlwaysUnless:
                prefix = !has_prefix;
                break;
            case SpacePrefix::FirstUnless:
                prefix = at_start && !has_prefix;
                break;
        }
        st.escaped.clear();
        if (prefix) st.escaped += rep;
        for (char c : s) {
            if (c == ' ')
                st.escaped += rep;
            else
                st.escaped += c;
        }
        s = st.escaped;
    }

    st.words.clear();
    splitter_.split(s, st.words);
    for (std::string_view w : st.words) encode_word(w, st, out);
}

void Tokenizer::encode_word(std::string_view word, EncodeState& st, std::vector<int32_t>& out) const {
    const bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
        auto it = st.cache.find(word);
        if (it != st.cache.end()) {
            const uint32_t off = static_cast<uint32_t>(it->second >> 32), cnt = static_cast<uint32_t>(it->second);
            out.insert(out.end(), st.pool.begin() + off, st.pool.begin() + off + cnt);
            return;
        }
    }
    st.word_ids.clear();
    const int32_t whole = ignore_merges_ ? model_lookup(word) : -1;
    if (whole >= 0)
        st.word_ids.push_back(whole);
    else if (merge_by_score_)
        merge_by_score(word, st);
    else
        merge_by_rank(word, st);
    out.insert(out.end(), st.word_ids.begin(), st.word_ids.end());
    if (cacheable) {
        const uint64_t v = (static_cast<uint64_t>(st.pool.size()) << 32) | st.word_ids.size();
        st.pool.insert(st.pool.end(), st.word_ids.begin(), st.word_ids.end());
        st.cache.emplace(std::string(word), v);
    }
}

// BPE by merge rank (Hugging Face's BPE model, llama.cpp's byte-level BPE): the symbols
// start as bytes (byte-level) or characters (SentencePiece-style, with byte fallback), then
// the adjacent pair of lowest rank merges, the leftmost among equals, until none merges.
void Tokenizer::merge_by_rank(std::string_view word, EncodeState& st) const {
    auto& syms = st.syms;
    syms.clear();
    auto add = [&](int32_t id, uint32_t start, uint32_t len) {
        const auto i = static_cast<int32_t>(syms.size());
        syms.push_back({id, i - 1, -1, start, len});
        if (i > 0) syms[i - 1].next = i;
    };
    if (kind_ == TokenizerKind::ByteLevelBpe) {
        for (size_t i = 0; i < word.size(); ++i) {
            const int32_t id = byte_ids_[static_cast<unsigned char>(word[i])];
            if (id >= 0)
                add(id, static_cast<uint32_t>(i), 1);
            else if (model_unk_id_ >= 0)
                add(model_unk_id_, static_cast<uint32_t>(i), 1);
        }
    } else {
        bool prev_unk = false;
        for (size_t i = 0; i < word.size();) {
            const size_t len = std::min<size_t>(utf8::seq_len(word[i]), word.size() - i);
            const int32_t id = model_lookup(word.substr(i, len));
            if (id >= 0) {
                add(id, static_cast<uint32_t>(i), static_cast<uint32_t>(len));
                prev_unk = false;
            } else {
                bool bytes_ok = byte_fallback_;
                for (size_t k = 0; bytes_ok && k < len; ++k)
                    bytes_ok = byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
                if (bytes_ok) {
                    for (size_t k = 0; k < len; ++k)
                        add(byte_ids_[static_cast<unsigned char>(word[i + k])], static_cast<uint32_t>(i + k), 1);
                    prev_unk = false;
                } else if (model_unk_id_ >= 0) {
                    if (fuse_unk_ && prev_unk)
                        syms.back().len += static_cast<uint32_t>(len);
                    else
                        add(model_unk_id_, static_cast<uint32_t>(i), static_cast<uint32_t>(len));
                    prev_unk = true;
                }
            }
            i += len;
        }
    }
    if (syms.size() > 1) {
        auto& heap = st.heap;
        heap.clear();
        auto queue = [&](int32_t l, int32_t r) {
            if (l < 0 || r < 0) return;
            int32_t merged = -1;
            const int32_t rank = pair_lookup(syms[l].id, syms[r].id, &merged);
            if (rank < 0) return;
            heap.push_back({-static_cast<double>(rank), l, r, syms[l].id, syms[r].id, 0, merged});
            std::push_heap(heap.begin(), heap.end());
        };
        for (size_t i = 0; i + 1 < syms.size(); ++i) queue(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
        while (!heap.empty()) {
            std::pop_heap(heap.begin(), heap.end());
            const EncodeState::Candidate c = heap.back();
            heap.pop_back();
            auto& L = syms[c.left];
            auto& R = syms[c.right];
            if (L.id != c.left_id || R.id != c.right_id || L.next != c.right) continue;  // stale
            L.id = c.merged;
            L.len += R.len;
            L.next = R.next;
            if (R.next >= 0) syms[R.next].prev = c.left;
            R.id = -1;
            queue(L.prev, c.left);
            queue(c.left, L.next);
        }
    }
    for (size_t i = 0; i < syms.size(); i = static_cast<size_t>(syms[i].next)) {
        st.word_ids.push_back(syms[i].id);
        if (syms[i].next < 0) break;
    }
}

// SentencePiece BPE by score (llama.cpp's `llama` vocabularies): symbols start as
// characters; the adjacent pair whose concatenation is the highest-scoring vocabulary entry
// merges first (the leftmost among equals). Pieces that are not entries fall back to bytes.
void Tokenizer::merge_by_score(std::string_view word, EncodeState& st) const {
    auto& syms = st.syms;
    syms.clear();
    for (size_t i = 0; i < word.size();) {
        const size_t len = std::min<size_t>(utf8::seq_len(word[i]), word.size() - i);
        const auto k = static_cast<int32_t>(syms.size());
        syms.push_back({0, k - 1, -1, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
        if (k > 0) syms[k - 1].next = k;
        i += len;
    }
    auto& heap = st.heap;
    heap.clear();
    auto queue = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const uint32_t size = syms[l].len + syms[r].len;
        const int32_t id = model_lookup(word.substr(syms[l].start, size));
        if (id < 0) return;
        heap.push_back({static_cast<double>(scores_[id]), l, r, 0, 0, size});
        std::push_heap(heap.begin(), heap.end());
    };
    for (size_t i = 0; i + 1 < syms.size(); ++i) queue(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const EncodeState::Candidate c = heap.back();
        heap.pop_back();
        auto& L = syms[c.left];
        auto& R = syms[c.right];
        if (L.len == 0 || R.len == 0 || L.next != c.right || L.len + R.len != c.size) continue;  // stale
        L.len += R.len;
        L.next = R.next;
        if (R.next >= 0) syms[R.next].prev = c.left;
        R.len = 0;
        queue(L.prev, c.left);
        queue(c.left, L.next);
    }
    for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
        const std::string_view text = word.substr(syms[i].start, syms[i].len);
        const int32_t id = model_lookup(text);
        if (id >= 0) {
            st.word_ids.push_back(id);
            continue;
        }
        for (char c : text) {
            const int32_t b = byte_ids_[static_cast<unsigned char>(c)];
            if (b >= 0)
                st.word_ids.push_back(b);
            else if (unk_id_ >= 0)
                st.word_ids.push_back(unk_id_);
        }
    }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    std::string out;
    for (int32_t id : ids) {
        if (!valid_id(id)) fail("token id ", id, " is outside the vocabulary (0..", size() - 1, ")");
        if (skip_special && is_special(id)) continue;
        out += pieces_[id];
    }
    if (strip_leading_space_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
    if (!utf8::is_valid(out)) out = utf8::sanitize(out);
    return out;
}

std::string Tokenizer::summary() const {
    std::ostringstream os;
    os << (kind_ == TokenizerKind::ByteLevelBpe ? "byte-level BPE" : "SentencePiece BPE") << ", " << size()
       << " tokens, ";
    if (merge_by_score_)
        os << "merges by score";
    else
        os << index_->merges.size() << " merges";
    os << ", " << splitter_.size() << " split regex" << (splitter_.size() == 1 ? "" : "es") << ", " << added_.size()
       << " added tokens";
    if (bos_id_ >= 0) os << ", bos " << bos_id_;
    if (eos_id_ >= 0) os << ", eos " << eos_id_;
    os << " (" << description_ << ")";
    return os.str();
}

}  // namespace peregrine
