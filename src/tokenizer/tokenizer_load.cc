// Loading a Tokenizer from a Hugging Face tokenizer.json (+ tokenizer_config.json,
// special_tokens_map.json) or from GGUF `tokenizer.ggml.*` metadata.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

namespace peregrine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int32_t kMaxVocab = 1 << 24;
constexpr const char* kSpmSpace = "\xe2\x96\x81";  // U+2581 ▁

json read_json(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, ": cannot open");
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        fail(path, ": invalid JSON: ", e.what());
    }
}

// "<0x0A>" → 10; -1 for anything else.
int parse_byte_token(std::string_view t) {
    if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
    int v = 0;
    for (size_t i = 3; i < 5; ++i) {
        const char c = t[i];
        const int d = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    if (from.empty()) return std::string(s);
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, from.size(), from) == 0) {
            out += to;
            i += from.size();
        } else {
            out += s[i++];
        }
    }
    return out;
}

// A special token in tokenizer_config.json: "<s>", {"content": "<s>", ...} or null.
std::string token_text(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return {};
}

// Whether a JSON tree mentions an object of {"type": name} anywhere.
bool mentions_type(const json& j, const std::string& name) {
    if (j.is_object()) {
        auto it = j.find("type");
        if (it != j.end() && it->is_string() && it->get<std::string>() == name) return true;
        for (const auto& [k, v] : j.items())
            if (mentions_type(v, name)) return true;
    } else if (j.is_array()) {
        for (const auto& v : j)
            if (mentions_type(v, name)) return true;
    }
    return false;
}

std::string regex_quote(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out += '\\';
        out += c;
    }
    return out;
}

template <typename T>
T get_or(const json& j, const char* key, T dflt) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    try {
        return it->get<T>();
    } catch (const json::exception&) {
        return dflt;
    }
}

int32_t json_id(const json& v, const std::string& where) {
    if (!v.is_number_integer()) fail(where, ": token id is not an integer");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= kMaxVocab) fail(where, ": token id ", id, " out of range");
    return static_cast<int32_t>(id);
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        const fs::path tj = fs::path(path) / "tokenizer.json";
        if (fs::exists(tj)) return from_tokenizer_json(tj.string());
        std::vector<fs::path> ggufs;
        for (const auto& e : fs::directory_iterator(path, ec))
            if (e.path().extension() == ".gguf") ggufs.push_back(e.path());
        if (ggufs.size() == 1) return from_gguf(GgufFile(ggufs[0].string()));
        fail(path, ": no tokenizer.json in this folder");
    }
    if (!fs::exists(path, ec)) fail(path, ": no such file or folder");
    char magic[4] = {};
    {
        std::ifstream in(path, std::ios::binary);
        if (!in) fail(path, ": cannot open");
        in.read(magic, 4);
    }
    if (std::string_view(magic, 4) == "GGUF") return from_gguf(GgufFile(path));
    return from_tokenizer_json(path);
}

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
    return TokenizerBuilder::from_json(path);
}
Tokenizer Tokenizer::from_gguf(const GgufFile& gguf) {
    return TokenizerBuilder::from_gguf(gguf);
}

void Tokenizer::finish_load(const std::string& where) {
    const int32_t n = size();
    if (n == 0) fail(where, ": empty vocabulary");
    for (int32_t* id : {&bos_id_, &eos_id_, &unk_id_, &pad_id_})
        if (*id >= n) *id = -1;
    for (auto* v : {&prefix_ids_, &suffix_ids_})
        for (int32_t id : *v)
            if (!valid_id(id)) fail(where, ": special token id ", id, " is outside the vocabulary");
    for (auto& v : added_by_byte_) v.clear();
    has_user_defined_ = false;
    for (size_t i = 0; i < added_.size(); ++i) {
        const AddedToken& a = added_[i];
        if (a.content.empty() || !valid_id(a.id)) continue;
        added_by_byte_[static_cast<unsigned char>(a.content[0])].push_back(static_cast<int32_t>(i));
        if (!a.special) has_user_defined_ = true;
    }
    for (auto& v : added_by_byte_)
        std::stable_sort(v.begin(), v.end(),
                         [&](int32_t a, int32_t b) { return added_[a].content.size() > added_[b].content.size(); });
    // SentencePiece text without a pre-tokenizer is one long word, and merging it whole costs
    // O(n log n) hash lookups. When no vocabulary entry has a "▁" after another character,
    // no merge can cross the start of a "▁word", so cutting the text there (before each "▁"
    // that follows another character) gives the same tokens, and lets words be cached.
    if (kind_ == TokenizerKind::SentencePieceBpe && splitter_.empty()) {
        std::string rep = space_replacement_;
        for (const auto& s : normalizer_)
            if (s.op == NormalizerStep::Op::Replace && s.a == " ") rep = s.b;
        bool crosses = rep.empty();
        for (auto it = index_->model.begin(); !crosses && it != index_->model.end(); ++it) {
            const std::string& k = it->first;
            for (size_t p = k.find(rep, 1); p != std::string::npos && !crosses; p = k.find(rep, p + 1))
                crosses = p < rep.size() || k.compare(p - rep.size(), rep.size(), rep) != 0;
        }
        if (!crosses) {
            // "(?<!▁)▁", the replacement written as code points (\x{2581}).
            std::string lit;
            for (size_t i = 0; i < rep.size();) {
                size_t len = 1;
                utf8::next_char(rep.data() + i, rep.size() - i, &len);
                char buf[16];
                std::snprintf(buf, sizeof(buf), "\\x{%x}", utf8::decode(rep.data() + i, len));
                lit += buf;
                i += len;
            }
            splitter_ = RegexSplitter({{"(?<!" + lit + ")" + lit, SplitBehavior::MergedWithNext, false}}, where);
        }
    }
    pieces_.assign(n, std::string());
    for (int32_t id = 0; id < n; ++id) {
        const std::string& t = tokens_[id];
        const TokenType ty = types_[id];
        if (kind_ == TokenizerKind::ByteLevelBpe) {
            if (ty == TokenType::Normal || ty == TokenType::Undefined) {
                if (!utf8::byte_level_decode(t, pieces_[id])) pieces_[id] = t;
            } else {
                pieces_[id] = t;
            }
        } else {
            const int b = ty == TokenType::Byte ? parse_byte_token(t) : -1;
            if (b >= 0)
                pieces_[id] = std::string(1, static_cast<char>(b));
            else if (ty == TokenType::Control || ty == TokenType::Unknown)
                pieces_[id] = t;
            else
                pieces_[id] = replace_all(t, space_replacement_.empty() ? kSpmSpace : space_replacement_, " ");
        }
    }
}

// --- tokenizer.json ----------------------------------------------------------------------

Tokenizer TokenizerBuilder::from_json(const std::string& path) {
    const json j = read_json(path);
    Tokenizer t;
    t.description_ = path;
    if (!j.is_object()) fail(path, ": not a tokenizer.json (not a JSON object)");
    auto mit = j.find("model");
    if (mit == j.end() || !mit->is_object()) fail(path, ": missing object 'model'");
    const json& model = *mit;
    const std::string type = get_or<std::string>(model, "type", "BPE");
    if (type != "BPE") fail(path, ": tokenizer model '", type, "' is not supported (BPE only)");
    auto vit = model.find("vocab");
    if (vit == model.end() || !vit->is_object()) fail(path, ": missing object 'model.vocab'");
    if (!get_or<std::string>(model, "continuing_subword_prefix", "").empty() ||
        !get_or<std::string>(model, "end_of_word_suffix", "").empty())
        fail(path, ": BPE with continuing_subword_prefix/end_of_word_suffix is not supported");

    const json null_json;
    const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : null_json;
    const json& dec = j.contains("decoder") ? j["decoder"] : null_json;
    const json& norm = j.contains("normalizer") ? j["normalizer"] : null_json;
    const json& post = j.contains("post_processor") ? j["post_processor"] : null_json;
    const bool byte_level = mentions_type(pre, "ByteLevel") || mentions_type(dec, "ByteLevel");
    t.kind_ = byte_level ? TokenizerKind::ByteLevelBpe : TokenizerKind::SentencePieceBpe;

    // Vocabulary.
    int32_t n = 0;
    for (const auto& [tok, id] : vit->items()) n = std::max(n, json_id(id, path + ": model.vocab['" + tok + "']") + 1);
    const json& added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : null_json;
    if (!added.is_null())
        for (const auto& a : added) {
            if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string())
                fail(path, ": malformed entry in 'added_tokens'");
            n = std::max(n, json_id(a["id"], path + ": added_tokens") + 1);
        }
    t.tokens_.assign(n, std::string());
    t.types_.assign(n, TokenType::Unused);
    auto& index = *t.index_;
    index.tokens.reserve(n);
    index.model.reserve(n);
    std::string raw;
    for (const auto& [tok, idv] : vit->items()) {
        const int32_t id = idv.get<int32_t>();
        t.tokens_[id] = tok;
        t.types_[id] = TokenType::Normal;
        index.tokens.emplace(tok, id);
        if (byte_level) {
            if (utf8::byte_level_decode(tok, raw)) index.model.emplace(raw, id);
        } else {
            index.model.emplace(tok, id);
        }
    }

    // Merges, by rank.
    t.byte_fallback_ = get_or<bool>(model, "byte_fallback", false);
    t.fuse_unk_ = get_or<bool>(model, "fuse_unk", false);
    t.ignore_merges_ = get_or<bool>(model, "ignore_merges", false);
    const std::string unk = get_or<std::string>(model, "unk_token", "");
    if (auto mergesit = model.find("merges"); mergesit != model.end() && mergesit->is_array()) {
        index.merges.reserve(mergesit->size());
        int32_t rank = 0;
        std::string a, b;
        for (const auto& m : *mergesit) {
            if (m.is_string()) {
                const std::string& s = m.get_ref<const std::string&>();
                const size_t sp = s.find(' ', 1);
                if (sp == std::string::npos) fail(path, ": merge ", rank, " ('", s, "') is not two tokens");
                a = s.substr(0, sp);
                b = s.substr(sp + 1);
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                a = m[0].get<std::string>();
                b = m[1].get<std::string>();
            } else {
                fail(path, ": merge ", rank, " is neither \"a b\" nor [a, b]");
            }
            auto ia = index.tokens.find(a), ib = index.tokens.find(b), im = index.tokens.find(a + b);
            if (ia == index.tokens.end() || ib == index.tokens.end() || im == index.tokens.end())
                fail(path, ": merge ", rank, " ('", a, "' + '", b, "') uses a token outside the vocabulary");
            index.merges.insert(ia->second, ib->second, rank, im->second);
            ++rank;
        }
    }

    // Added tokens.
    if (!added.is_null())
        for (const auto& a : added) {
            Tokenizer::AddedToken at;
            at.id = a["id"].get<int32_t>();
            at.content = a["content"].get<std::string>();
            at.special = get_or<bool>(a, "special", false);
            at.lstrip = get_or<bool>(a, "lstrip", false);
            at.rstrip = get_or<bool>(a, "rstrip", false);
            t.tokens_[at.id] = at.content;
            t.types_[at.id] = at.special ? TokenType::Control : TokenType::UserDefined;
            index.tokens.insert_or_assign(at.content, at.id);
            t.added_.push_back(std::move(at));
        }
    if (!unk.empty()) t.unk_id_ = t.model_unk_id_ = t.token_to_id(unk);

    // Single bytes.
    for (int32_t id = 0; id < n; ++id) {
        if (t.types_[id] != TokenType::Normal) continue;
        if (byte_level) {
            if (utf8::byte_level_decode(t.tokens_[id], raw) && raw.size() == 1 &&
                t.byte_ids_[static_cast<unsigned char>(raw[0])] < 0)
                t.byte_ids_[static_cast<unsigned char>(raw[0])] = id;
        } else if (const int b = parse_byte_token(t.tokens_[id]); b >= 0) {
            t.types_[id] = TokenType::Byte;
            t.byte_ids_[b] = id;
        }
    }

    // Normalizer.
    std::function<void(const json&)> add_norm = [&](const json& nj) {
        if (nj.is_null()) return;
        const std::string ty = get_or<std::string>(nj, "type", "");
        using Step = Tokenizer::NormalizerStep;
        if (ty == "Sequence") {
            for (const auto& s : nj.value("normalizers", json::array())) add_norm(s);
        } else if (ty == "NFC" || ty == "NFKC" || ty == "NFD" || ty == "NFKD") {
            Step s;
            s.form = ty == "NFC"    ? utf8::NormalForm::NFC
                     : ty == "NFKC" ? utf8::NormalForm::NFKC
                     : ty == "NFD"  ? utf8::NormalForm::NFD
                                    : utf8::NormalForm::NFKD;
            t.normalizer_.push_back(s);
        } else if (ty == "Prepend") {
            Step s;
            s.op = Step::Op::Prepend;
            s.a = get_or<std::string>(nj, "prepend", "");
            t.normalizer_.push_back(s);
        } else if (ty == "Replace") {
            const json pat = nj.value("pattern", json::object());
            if (!pat.contains("String") || !pat["String"].is_string())
                fail(path, ": normalizer Replace with a regex pattern is not supported");
            Step s;
            s.op = Step::Op::Replace;
            s.a = pat["String"].get<std::string>();
            s.b = get_or<std::string>(nj, "content", "");
            t.normalizer_.push_back(s);
        } else {
            fail(path, ": normalizer '", ty, "' is not supported");
        }
    };
    add_norm(norm);

    // Pre-tokenizer.
    std::vector<SplitRule> rules;
    std::function<void(const json&)> add_pre = [&](const json& pj) {
        if (pj.is_null()) return;
        const std::string ty = get_or<std::string>(pj, "type", "");
        if (ty == "Sequence") {
            for (const auto& s : pj.value("pretokenizers", json::array())) add_pre(s);
        } else if (ty == "Split") {
            const json pat = pj.value("pattern", json::object());
            SplitRule r;
            if (pat.contains("Regex") && pat["Regex"].is_string())
                r.pattern = pat["Regex"].get<std::string>();
            else if (pat.contains("String") && pat["String"].is_string())
                r.pattern = regex_quote(pat["String"].get<std::string>());
            else
                fail(path, ": pre-tokenizer Split without a pattern");
            const std::string beh = get_or<std::string>(pj, "behavior", "Isolated");
            if (beh == "Isolated")
                r.behavior = SplitBehavior::Isolated;
            else if (beh == "Removed")
                r.behavior = SplitBehavior::Removed;
            else if (beh == "MergedWithPrevious")
                r.behavior = SplitBehavior::MergedWithPrevious;
            else if (beh == "MergedWithNext")
                r.behavior = SplitBehavior::MergedWithNext;
            else if (beh == "Contiguous")
                r.behavior = SplitBehavior::Contiguous;
            else
                fail(path, ": pre-tokenizer Split behavior '", beh, "' is not supported");
            r.invert = get_or<bool>(pj, "invert", false);
            rules.push_back(std::move(r));
        } else if (ty == "ByteLevel") {
            if (get_or<bool>(pj, "use_regex", true)) rules.push_back({kGpt2SplitRegex, SplitBehavior::Isolated, false});
            t.byte_level_prefix_space_ = get_or<bool>(pj, "add_prefix_space", false);
        } else if (ty == "Metaspace") {
            t.space_replacement_ = get_or<std::string>(pj, "replacement", kSpmSpace);
            const std::string scheme = get_or<std::string>(
                pj, "prepend_scheme", get_or<bool>(pj, "add_prefix_space", true) ? "always" : "never");
            t.space_prefix_ = scheme == "first"    ? Tokenizer::SpacePrefix::FirstUnless
                              : scheme == "always" ? Tokenizer::SpacePrefix::AlwaysUnless
                                                   : Tokenizer::SpacePrefix::Never;
            if (get_or<bool>(pj, "split", true))
                rules.push_back({regex_quote(t.space_replacement_), SplitBehavior::MergedWithNext, false});
        } else if (ty == "Digits") {
            rules.push_back({get_or<bool>(pj, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)",
                             SplitBehavior::Isolated, false});
        } else if (ty == "Punctuation") {
            rules.push_back({R"(\p{P})", SplitBehavior::Isolated, false});
        } else if (ty == "WhitespaceSplit") {
            rules.push_back({R"(\s+)", SplitBehavior::Removed, false});
        } else if (ty == "Whitespace") {
            rules.push_back({R"(\w+|[^\w\s]+)", SplitBehavior::Removed, true});
        } else {
            fail(path, ": pre-tokenizer '", ty, "' is not supported");
        }
    };
    add_pre(pre);
    t.splitter_ = RegexSplitter(std::move(rules), path);

    // Decoder: SentencePiece's leading space, the replacement character.
    std::string dec_replacement;
    std::function<void(const json&)> read_dec = [&](const json& dj) {
        if (dj.is_null()) return;
        const std::string ty = get_or<std::string>(dj, "type", "");
        if (ty == "Sequence") {
            for (const auto& s : dj.value("decoders", json::array())) read_dec(s);
        } else if (ty == "Strip") {
            if (get_or<std::string>(dj, "content", " ") == " " && get_or<int>(dj, "start", 0) > 0)
                t.strip_leading_space_ = true;
        } else if (ty == "Metaspace") {
            dec_replacement = get_or<std::string>(dj, "replacement", kSpmSpace);
            const std::string scheme = get_or<std::string>(
                dj, "prepend_scheme", get_or<bool>(dj, "add_prefix_space", true) ? "always" : "never");
            if (scheme != "never") t.strip_leading_space_ = true;
        } else if (ty == "Replace") {
            const json pat = dj.value("pattern", json::object());
            if (pat.contains("String") && pat["String"].is_string() && get_or<std::string>(dj, "content", "") == " ")
                dec_replacement = pat["String"].get<std::string>();
        }
    };
    read_dec(dec);

    // Post-processor: what add_special_tokens puts around the text.
    std::function<void(const json&)> read_post = [&](const json& pj) {
        if (pj.is_null()) return;
        const std::string ty = get_or<std::string>(pj, "type", "");
        if (ty == "Sequence") {
            for (const auto& s : pj.value("processors", json::array())) read_post(s);
        } else if (ty == "TemplateProcessing") {
            const json specials = pj.value("special_tokens", json::object());
            bool after = false;
            for (const auto& item : pj.value("single", json::array())) {
                if (item.contains("Sequence")) {
                    after = true;
                    continue;
                }
                if (!item.contains("SpecialToken")) continue;
                const std::string name = get_or<std::string>(item["SpecialToken"], "id", "");
                std::vector<int32_t> ids;
                if (specials.contains(name) && specials[name].contains("ids"))
                    for (const auto& v : specials[name]["ids"]) ids.push_back(json_id(v, path + ": post_processor"));
                else if (const int32_t id = t.token_to_id(name); id >= 0)
                    ids.push_back(id);
                else
                    fail(path, ": post_processor names an unknown special token '", name, "'");
                auto& dst = after ? t.suffix_ids_ : t.prefix_ids_;
                dst.insert(dst.end(), ids.begin(), ids.end());
            }
        } else if (ty == "RobertaProcessing" || ty == "BertProcessing") {
            const json cls = pj.value("cls", json::array()), sep = pj.value("sep", json::array());
            if (cls.size() == 2) t.prefix_ids_.push_back(json_id(cls[1], path + ": post_processor.cls"));
            if (sep.size() == 2) t.suffix_ids_.push_back(json_id(sep[1], path + ": post_processor.sep"));
        }
    };
    read_post(post);

    // tokenizer_config.json and special_tokens_map.json beside the file.
    const fs::path dir = fs::path(path).parent_path();
    json cfg = json::object(), stm = json::object();
    if (fs::exists(dir / "tokenizer_config.json")) cfg = read_json((dir / "tokenizer_config.json").string());
    if (fs::exists(dir / "special_tokens_map.json")) stm = read_json((dir / "special_tokens_map.json").string());
    if (!cfg.is_object()) fail((dir / "tokenizer_config.json").string(), ": not a JSON object");
    if (!stm.is_object()) fail((dir / "special_tokens_map.json").string(), ": not a JSON object");
    auto special = [&](const char* key) {
        std::string s = cfg.contains(key) ? token_text(cfg[key]) : "";
        if (s.empty() && stm.contains(key)) s = token_text(stm[key]);
        return s.empty() ? -1 : t.token_to_id(s);
    };
    t.bos_id_ = special("bos_token");
    t.eos_id_ = special("eos_token");
    if (const int32_t u = special("unk_token"); u >= 0 && t.unk_id_ < 0) t.unk_id_ = u;
    t.pad_id_ = special("pad_token");
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
        t.prefix_ids_.clear();
        if (cfg["add_bos_token"].get<bool>() && t.bos_id_ >= 0) t.prefix_ids_.push_back(t.bos_id_);
    }
    if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) {
        t.suffix_ids_.clear();
        if (cfg["add_eos_token"].get<bool>() && t.eos_id_ >= 0) t.suffix_ids_.push_back(t.eos_id_);
    }

    t.finish_load(path);
    if (!byte_level && t.space_replacement_.empty() && !dec_replacement.empty() && dec_replacement != kSpmSpace) {
        // Spaces escaped by the normalizer with another character: decoding maps it back.
        for (int32_t id = 0; id < t.size(); ++id)
            if (t.types_[id] == TokenType::Normal || t.types_[id] == TokenType::UserDefined)
                t.pieces_[id] = replace_all(t.tokens_[id], dec_replacement, " ");
    }
    return t;
}

// --- GGUF ----------------------------------------------------------------------------------

namespace {

bool gguf_flag(const GgufFile& g, const char* key, bool dflt) {
    const GgufValue* v = g.find(key);
    if (!v) return dflt;
    if (v->type == GgufType::BOOL) return v->b;
    if (gguf_type_is_integer(v->type)) return v->i != 0;
    fail(g.path(), ": metadata key '", key, "' has type ", v->type_str(), ", expected bool");
}

}  // namespace

Tokenizer TokenizerBuilder::from_gguf(const GgufFile& g) {
    const std::string& path = g.path();
    Tokenizer t;
    t.description_ = path;
    const std::string model = g.get_string_or("tokenizer.ggml.model", "");
    if (model.empty()) fail(path, ": no vocabulary (metadata key 'tokenizer.ggml.model' missing)");
    if (model == "llama") {
        t.kind_ = TokenizerKind::SentencePieceBpe;
        t.merge_by_score_ = true;
    } else if (model == "gpt2") {
        t.kind_ = TokenizerKind::ByteLevelBpe;
    } else {
        fail(path, ": tokenizer model '", model, "' is not supported (llama, gpt2)");
    }
    t.tokens_ = g.get_string_array("tokenizer.ggml.tokens");
    const auto n = static_cast<int32_t>(t.tokens_.size());
    if (n == 0 || n >= kMaxVocab) fail(path, ": 'tokenizer.ggml.tokens' has ", n, " entries");
    t.types_.assign(n, TokenType::Normal);
    if (g.has("tokenizer.ggml.token_type")) {
        const std::vector<int64_t> ty = g.get_int_array("tokenizer.ggml.token_type");
        if (static_cast<int32_t>(ty.size()) != n)
            fail(path, ": 'tokenizer.ggml.token_type' has ", ty.size(), " entries for ", n, " tokens");
        for (int32_t i = 0; i < n; ++i)
            t.types_[i] = ty[i] >= 0 && ty[i] <= 6 ? static_cast<TokenType>(ty[i]) : TokenType::Normal;
    }
    if (g.has("tokenizer.ggml.scores")) {
        const std::vector<double> sc = g.get_float_array("tokenizer.ggml.scores");
        if (static_cast<int32_t>(sc.size()) != n)
            fail(path, ": 'tokenizer.ggml.scores' has ", sc.size(), " entries for ", n, " tokens");
        t.scores_.assign(sc.begin(), sc.end());
    } else if (t.merge_by_score_) {
        t.scores_.assign(n, 0.0f);
    }

    auto& index = *t.index_;
    index.tokens.reserve(n);
    index.model.reserve(n);
    for (int32_t id = 0; id < n; ++id) index.tokens.emplace(t.tokens_[id], id);
    auto id_of = [&](const char* key) {
        const int64_t v = g.get_int_or(key, -1);
        return v >= 0 && v < n ? static_cast<int32_t>(v) : -1;
    };
    t.bos_id_ = id_of("tokenizer.ggml.bos_token_id");
    t.eos_id_ = id_of("tokenizer.ggml.eos_token_id");
    t.unk_id_ = id_of("tokenizer.ggml.unknown_token_id");
    t.pad_id_ = id_of("tokenizer.ggml.padding_token_id");

    if (t.kind_ == TokenizerKind::SentencePieceBpe) {
        for (int32_t id = 0; id < n; ++id) {
            index.model.emplace(t.tokens_[id], id);
            const int b = parse_byte_token(t.tokens_[id]);
            if (b >= 0 && (t.types_[id] == TokenType::Byte || !g.has("tokenizer.ggml.token_type"))) {
                t.types_[id] = TokenType::Byte;
                if (t.byte_ids_[b] < 0) t.byte_ids_[b] = id;
            }
        }
        t.space_replacement_ = kSpmSpace;
        const bool prefix = gguf_flag(g, "tokenizer.ggml.add_space_prefix", true);
        t.space_prefix_ = prefix ? Tokenizer::SpacePrefix::Always : Tokenizer::SpacePrefix::Never;
        t.strip_leading_space_ = prefix;
    } else {
        std::string raw;
        for (int32_t id = 0; id < n; ++id)
            if (utf8::byte_level_decode(t.tokens_[id], raw)) index.model.emplace(raw, id);
        for (int b = 0; b < 256; ++b) t.byte_ids_[b] = t.model_lookup(std::string(1, static_cast<char>(b)));
        const std::vector<std::string> merges = g.get_string_array("tokenizer.ggml.merges");
        index.merges.reserve(merges.size());
        for (size_t r = 0; r < merges.size(); ++r) {
            const std::string& m = merges[r];
            const size_t sp = m.find(' ', 1);
            if (sp == std::string::npos) fail(path, ": merge ", r, " ('", m, "') is not two tokens");
            const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
            auto ia = index.tokens.find(a), ib = index.tokens.find(b), im = index.tokens.find(a + b);
            if (ia == index.tokens.end() || ib == index.tokens.end() || im == index.tokens.end()) continue;
            index.merges.insert(ia->second, ib->second, static_cast<int32_t>(r), im->second);
        }
        std::vector<SplitRule> rules;
        try {
            rules = gguf_pre_tokenizer_rules(g.get_string_or("tokenizer.ggml.pre", "default"), &t.ignore_merges_);
        } catch (const Error& e) {
            fail(path, ": 'tokenizer.ggml.pre': ", e.what());
        }
        t.splitter_ = RegexSplitter(std::move(rules), path);
    }

    // Control, unknown and user-defined tokens are cut out of the text before BPE.
    for (int32_t id = 0; id < n; ++id) {
        const TokenType ty = t.types_[id];
        if (ty != TokenType::Control && ty != TokenType::UserDefined && ty != TokenType::Unknown) continue;
        Tokenizer::AddedToken a;
        a.id = id;
        a.content = t.tokens_[id];
        a.special = ty != TokenType::UserDefined;
        t.added_.push_back(std::move(a));
    }

    const bool add_bos = gguf_flag(g, "tokenizer.ggml.add_bos_token", t.kind_ == TokenizerKind::SentencePieceBpe);
    const bool add_eos = gguf_flag(g, "tokenizer.ggml.add_eos_token", false);
    if (add_bos && t.bos_id_ >= 0) t.prefix_ids_.push_back(t.bos_id_);
    if (add_eos && t.eos_id_ >= 0) t.suffix_ids_.push_back(t.eos_id_);
    t.finish_load(path);
    return t;
}

}  // namespace peregrine
