// Token id → bytes, for printing generated text. (Encoding text lives in the tokenizer.)
#pragma once

#include <string>
#include <vector>

namespace peregrine {

class GgufFile;

enum class VocabKind {
    SentencePiece,  // "▁" marks a space, <0xXX> tokens are raw bytes (Llama 2, Mistral, stories260K)
    ByteLevel,      // GPT-2's byte-to-unicode alphabet (Llama 3, Qwen)
};

class Vocab {
  public:
    static Vocab from_tokenizer_json(const std::string& path);
    static Vocab from_gguf(const GgufFile& gguf);

    VocabKind kind() const { return kind_; }
    int size() const { return static_cast<int>(tokens_.size()); }
    bool is_special(int id) const { return id >= 0 && id < size() && special_[id]; }
    const std::string& token(int id) const { return tokens_.at(id); }

    // The bytes token `id` contributes to text; special tokens give "" unless `with_special`.
    // SentencePiece's "▁" becomes a space (the caller drops the space that starts a text).
    std::string token_bytes(int id, bool with_special = false) const;

    // Whole-sequence decode, as Hugging Face's decode(skip_special_tokens=True).
    std::string decode(const std::vector<int>& ids) const;

  private:
    VocabKind kind_ = VocabKind::SentencePiece;
    std::vector<std::string> tokens_;
    std::vector<bool> special_;
};

// Splits off the longest prefix of `pending` that is complete UTF-8, so streamed text never
// ends inside a character.
std::string take_complete_utf8(std::string& pending);

}  // namespace peregrine
