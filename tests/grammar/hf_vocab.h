// Test and benchmark helper: a grammar::Vocabulary from a Hugging Face tokenizer.json, decoded
// here (byte-level BPE's printable-byte alphabet, or SentencePiece's U+2581 spaces and <0xXX>
// byte tokens) so that the grammar layer's tests need no tokenizer library.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/utf8.h"
#include "grammar/vocabulary.h"

namespace peregrine::grammar::testing {

inline Vocabulary load_hf_vocab(const std::string& path, const std::vector<std::string>& eos_names) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    nlohmann::json j = nlohmann::json::parse(in);
    const auto& vocab = j["model"]["vocab"];
    // byte-level: GPT-2's bytes_to_unicode, inverted.
    std::map<uint32_t, uint8_t> byte_of;
    {
        std::vector<int> bs;
        for (int b = 33; b < 127; ++b) bs.push_back(b);
        for (int b = 161; b < 173; ++b) bs.push_back(b);
        for (int b = 174; b < 256; ++b) bs.push_back(b);
        std::vector<int> cs = bs;
        int n = 0;
        for (int b = 0; b < 256; ++b)
            if (std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b), cs.push_back(256 + n++);
        for (size_t i = 0; i < bs.size(); ++i) byte_of[uint32_t(cs[i])] = uint8_t(bs[i]);
    }
    bool byte_level = false;
    if (j.contains("decoder") && j["decoder"].is_object()) byte_level = j["decoder"].value("type", "") == "ByteLevel";
    size_t size = 0;
    for (auto& [k, v] : vocab.items()) size = std::max(size, size_t(v.get<int>()) + 1);
    for (const auto& t : j["added_tokens"]) size = std::max(size, size_t(t["id"].get<int>()) + 1);
    Vocabulary out;
    out.tokens.assign(size, "");
    out.special.assign(size, false);
    for (auto& [k, v] : vocab.items()) {
        std::string bytes;
        if (byte_level) {
            for (size_t pos = 0; pos < k.size();) {
                uint32_t cp = decode_utf8(k, pos);
                bytes += char(byte_of.at(cp));
            }
        } else if (k.size() == 6 && k.rfind("<0x", 0) == 0 && k[5] == '>') {
            bytes = char(std::stoi(k.substr(3, 2), nullptr, 16));
        } else {
            for (size_t pos = 0; pos < k.size();) {
                size_t at = pos;
                uint32_t cp = decode_utf8(k, pos);
                if (cp == 0x2581)
                    bytes += ' ';
                else
                    bytes += k.substr(at, pos - at);
            }
        }
        out.tokens[size_t(v.get<int>())] = bytes;
    }
    for (const auto& t : j["added_tokens"]) {
        size_t id = size_t(t["id"].get<int>());
        out.tokens[id] = t["content"].get<std::string>();
        out.special[id] = t.value("special", false);
        for (const auto& name : eos_names)
            if (t["content"] == name) out.eos.push_back(int32_t(id));
    }
    return out;
}

inline std::string tokenizer_dir() {
    return PG_TOKENIZER_DATA_DIR;
}

inline Vocabulary llama3_vocab() {
    return load_hf_vocab(tokenizer_dir() + "/llama3/tokenizer.json", {"<|end_of_text|>", "<|eot_id|>"});
}
inline Vocabulary qwen3_vocab() {
    return load_hf_vocab(tokenizer_dir() + "/qwen3/tokenizer.json", {"<|im_end|>", "<|endoftext|>"});
}
inline Vocabulary stories_vocab() {
    return load_hf_vocab(std::string(PG_MODELS_DIR) + "/stories260K/tokenizer.json", {"</s>"});
}

// The two vocabularies as shared indexes, built once per test process; and a grammar bound to one.
inline std::shared_ptr<const VocabIndex> stories_index() {
    static auto v = std::make_shared<const VocabIndex>(stories_vocab());
    return v;
}
inline std::shared_ptr<const VocabIndex> llama3_index() {
    static auto v = std::make_shared<const VocabIndex>(llama3_vocab());
    return v;
}

}  // namespace peregrine::grammar::testing
