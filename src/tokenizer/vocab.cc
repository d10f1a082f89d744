#include "tokenizer/vocab.h"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"

namespace peregrine {

namespace {

// GPT-2 maps every byte to a printable code point: printable Latin-1 bytes map to themselves,
// the rest to U+0100 upwards in byte order. Returns code point -> byte (-1 if none).
const std::array<int, 512>& byte_level_decoder() {
    static const std::array<int, 512> table = [] {
        std::array<int, 512> t;
        t.fill(-1);
        int next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
            t[printable ? b : next++] = b;
        }
        return t;
    }();
    return table;
}

// Decodes one UTF-8 code point at s[i], advancing i; returns -1 on malformed input.
int next_code_point(const std::string& s, size_t& i) {
    const unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
        ++i;
        return -1;
    }
    int cp = len == 1 ? c : c & (0x7f >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    i += len;
    return cp;
}

bool parse_byte_token(const std::string& t, unsigned char* out) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
    *out = static_cast<unsigned char>(std::stoi(t.substr(3, 2), nullptr, 16));
    return true;
}

}  // namespace

Vocab Vocab::from_tokenizer_json(const std::string& path) {
    std::ifstream in(path);
    if (!in) fail(path, ": cannot open");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        fail(path, ": invalid JSON: ", e.what());
    }
    Vocab v;
    const auto& model = j.value("model", nlohmann::json::object());
    if (!model.contains("vocab") || !model["vocab"].is_object()) fail(path, ": missing object 'model.vocab'");
    auto put = [&](const std::string& tok, int id, bool special) {
        if (id < 0) fail(path, ": negative token id for '", tok, "'");
        if (id >= static_cast<int>(v.tokens_.size())) {
            v.tokens_.resize(id + 1);
            v.special_.resize(id + 1);
        }
        v.tokens_[id] = tok;
        v.special_[id] = special;
    };
    for (auto& [tok, id] : model["vocab"].items()) put(tok, id.get<int>(), false);
    if (j.contains("added_tokens"))
        for (const auto& t : j["added_tokens"]) put(t.at("content"), t.at("id"), t.value("special", false));
    const std::string dump =
        j.value("decoder", nlohmann::json()).dump() + j.value("pre_tokenizer", nlohmann::json()).dump();
    v.kind_ = dump.find("ByteLevel") != std::string::npos ? VocabKind::ByteLevel : VocabKind::SentencePiece;
    return v;
}

Vocab Vocab::from_gguf(const GgufFile& g) {
    Vocab v;
    v.tokens_ = g.get_string_array("tokenizer.ggml.tokens");
    v.special_.assign(v.tokens_.size(), false);
    if (g.has("tokenizer.ggml.token_type")) {
        const std::vector<int64_t> types = g.get_int_array("tokenizer.ggml.token_type");
        for (size_t i = 0; i < types.size() && i < v.special_.size(); ++i) v.special_[i] = types[i] == 3;  // control
    }
    const std::string model = g.get_string_or("tokenizer.ggml.model", "llama");
    v.kind_ = model == "llama" ? VocabKind::SentencePiece : VocabKind::ByteLevel;
    return v;
}

std::string Vocab::token_bytes(int id, bool with_special) const {
    if (id < 0 || id >= size()) return "";
    if (special_[id] && !with_special) return "";
    const std::string& t = tokens_[id];
    std::string out;
    if (kind_ == VocabKind::SentencePiece) {
        unsigned char b;
        if (parse_byte_token(t, &b)) return std::string(1, static_cast<char>(b));
        for (size_t i = 0; i < t.size();) {
            if (t.compare(i, 3, "\xe2\x96\x81") == 0) {  // U+2581 ▁
                out += ' ';
                i += 3;
            } else {
                out += t[i++];
            }
        }
        return out;
    }
    if (special_[id]) return t;
    const auto& table = byte_level_decoder();
    for (size_t i = 0; i < t.size();) {
        const int cp = next_code_point(t, i);
        if (cp >= 0 && cp < 512 && table[cp] >= 0) out += static_cast<char>(table[cp]);
    }
    return out;
}

std::string Vocab::decode(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) out += token_bytes(id);
    if (kind_ == VocabKind::SentencePiece && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
}

std::string take_complete_utf8(std::string& pending) {
    // Walk back over at most 3 continuation bytes to the last lead byte; keep it if its
    // character is incomplete.
    size_t cut = pending.size();
    for (size_t back = 1; back <= 4 && back <= pending.size(); ++back) {
        const unsigned char c = pending[pending.size() - back];
        if ((c & 0xc0) == 0x80) continue;  // continuation byte
        const size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (need > back) cut = pending.size() - back;
        break;
    }
    std::string ready = pending.substr(0, cut);
    pending.erase(0, cut);
    return ready;
}

}  // namespace peregrine
