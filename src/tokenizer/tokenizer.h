// Text ↔ token ids for the llama family: byte-level BPE (GPT-2, Llama 3, Qwen2/3, DeepSeek,
// StarCoder, MPT, Falcon) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral,
// Phi-3, TinyLlama, stories260K), loaded from a Hugging Face tokenizer.json or from GGUF
// `tokenizer.ggml.*` metadata.
//
// encode(): added/special tokens are cut out first (special ones only with parse_special),
// each stretch of text between them is normalized, pre-tokenized (PCRE2 regexes) and merged
// word by word. A Tokenizer is immutable after loading and safe to use from many threads.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace peregrine {

class GgufFile;

// GGUF's token types (llama.cpp's llama_token_type); Hugging Face added tokens map to
// Control (special: true) and UserDefined (special: false).
enum class TokenType : uint8_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
};

enum class TokenizerKind {
    ByteLevelBpe,      // merges over bytes in GPT-2's byte-to-unicode alphabet, by merge rank
    SentencePieceBpe,  // "▁" for spaces, merges over characters, <0xXX> byte fallback
};

class Tokenizer {
  public:
    // A tokenizer.json, a GGUF file (vocab-only or a full model), or a folder that holds a
    // tokenizer.json. Throws Error naming the file and what is wrong.
    static Tokenizer load(const std::string& path);
    // Also reads tokenizer_config.json and special_tokens_map.json beside it when present
    // (add_bos_token, add_eos_token, bos/eos/unk/pad tokens).
    static Tokenizer from_tokenizer_json(const std::string& path);
    static Tokenizer from_gguf(const GgufFile& gguf);

    // Token ids for `text` (UTF-8; ill-formed bytes are read as U+FFFD).
    // add_special_tokens: the tokenizer's own prefix/suffix (BOS for Llama, none for Qwen).
    // parse_special: special-token text ("<|im_start|>") becomes that token; otherwise it is
    // tokenized as plain text. Non-special added tokens are always recognized, as in
    // Hugging Face tokenizers and llama.cpp.
    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true,
                                bool parse_special = false) const;

    // The text of `ids`: byte-level and byte-fallback tokens joined into bytes, ill-formed
    // UTF-8 replaced by U+FFFD, SentencePiece's leading space dropped. Special tokens are
    // left out with skip_special. Throws Error for an id outside the vocabulary.
    std::string decode(std::span<const int32_t> ids, bool skip_special = true) const;
    std::string decode(std::initializer_list<int32_t> ids, bool skip_special = true) const {
        return decode(std::span<const int32_t>(ids.begin(), ids.size()), skip_special);
    }

    TokenizerKind kind() const { return kind_; }
    int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
    bool valid_id(int32_t id) const { return id >= 0 && id < size(); }
    // The vocabulary entry ("Ġhello", "▁hello", "<0x0A>", "<|im_start|>").
    const std::string& token(int32_t id) const { return tokens_.at(id); }
    // The bytes the token adds to decoded text (a space for "▁"; may be part of a character).
    const std::string& piece(int32_t id) const { return pieces_.at(id); }
    TokenType type(int32_t id) const { return types_.at(id); }
    // Left out of decoded text with skip_special (control, unknown and unused tokens).
    bool is_special(int32_t id) const;
    // The id of a vocabulary entry or added token, -1 when there is none.
    int32_t token_to_id(std::string_view token) const;

    int32_t bos_id() const { return bos_id_; }  // -1 when the tokenizer has none
    int32_t eos_id() const { return eos_id_; }
    int32_t unk_id() const { return unk_id_; }
    int32_t pad_id() const { return pad_id_; }
    // What encode(..., add_special_tokens=true) puts around the text.
    const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
    const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }
    // SentencePiece decoding drops the space that starts the text (HF's Strip/Metaspace
    // decoders, llama.cpp's add_space_prefix).
    bool strips_leading_space() const { return strip_leading_space_; }

    // "byte-level BPE, 128256 tokens, 280147 merges, pre-tokenizer: 1 regex, ..." for logs.
    std::string summary() const;

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

  private:
    Tokenizer();
    friend class TokenizerBuilder;
    struct EncodeState;
    struct AddedToken {
        std::string content;
        int32_t id = -1;
        bool special = false;  // matched only with parse_special
        bool lstrip = false;   // swallows the whitespace before it
        bool rstrip = false;   // swallows the whitespace after it
    };
    // How SentencePiece text gets its leading "▁".
    enum class SpacePrefix {
        Never,
        Always,        // every stretch of text (llama.cpp add_space_prefix, HF Prepend normalizer)
        AlwaysUnless,  // every stretch that does not start with one (HF Metaspace "always")
        FirstUnless,   // only the stretch at the start of the text (HF Metaspace "first")
    };
    struct NormalizerStep {
        enum class Op { Normalize, Prepend, Replace } op = Op::Normalize;
        utf8::NormalForm form = utf8::NormalForm::None;
        std::string a, b;  // Prepend: a; Replace: a → b
    };

    void encode_stretch(std::string_view text, bool at_start, EncodeState& st, std::vector<int32_t>& out) const;
    void encode_word(std::string_view word, EncodeState& st, std::vector<int32_t>& out) const;
    void merge_by_rank(std::string_view word, EncodeState& st) const;
    void merge_by_score(std::string_view word, EncodeState& st) const;
    int32_t model_lookup(std::string_view s) const;
    int32_t pair_lookup(int32_t left, int32_t right, int32_t* merged) const;
    void finish_load(const std::string& where);

    TokenizerKind kind_ = TokenizerKind::ByteLevelBpe;
    std::vector<std::string> tokens_;
    std::vector<std::string> pieces_;
    std::vector<TokenType> types_;
    std::vector<float> scores_;  // SentencePiece scores (GGUF); empty when merges rank by order

    struct Index;  // string → id hash maps, the merge table
    std::unique_ptr<Index> index_;
    std::array<int32_t, 256> byte_ids_;  // the token of each single byte (byte-level) or <0xXX>

    bool merge_by_score_ = false;  // GGUF `llama` vocabularies: highest-scoring pair first
    bool ignore_merges_ = false;   // a word that is one token whole skips merging (Llama 3)
    bool byte_fallback_ = false;
    bool fuse_unk_ = false;
    std::vector<NormalizerStep> normalizer_;
    bool byte_level_prefix_space_ = false;  // HF ByteLevel add_prefix_space
    SpacePrefix space_prefix_ = SpacePrefix::Never;
    std::string space_replacement_;  // "▁" for SentencePiece (spaces become it), "" for none
    RegexSplitter splitter_;

    std::vector<AddedToken> added_;
    std::array<std::vector<int32_t>, 256> added_by_byte_;  // indices into added_, longest first
    bool has_user_defined_ = false;

    int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1, pad_id_ = -1;
    // What rank-merge BPE emits for a symbol outside the vocabulary: Hugging Face's
    // model.unk_token; none for GGUF (llama.cpp drops such bytes).
    int32_t model_unk_id_ = -1;
    std::vector<int32_t> prefix_ids_, suffix_ids_;
    bool strip_leading_space_ = false;
    std::string description_;  // where it came from, for summary()
};

}  // namespace peregrine
