#include "server/openai/response_json.h"

#include <cmath>
#include <random>

#include "tokenizer/tokenizer.h"

namespace peregrine::server {

Json usage_json(const Usage& u) {
    Json j;
    j["prompt_tokens"] = u.prompt_tokens;
    j["completion_tokens"] = u.completion_tokens;
    j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
    j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
    return j;
}

namespace {

Json logprob_value(float lp) {
    return std::isfinite(lp) ? Json(lp) : Json(-9999.0);
}

Json byte_list(const std::string& s) {
    Json b = Json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
}

}  // namespace

namespace {

// Characters (Unicode code points) of `s`: its bytes that do not continue a UTF-8 sequence, so
// the pieces of a character split over tokens add up to one.
int utf8_chars(const std::string& s) {
    int n = 0;
    for (unsigned char ch : s) n += (ch & 0xC0) != 0x80 ? 1 : 0;
    return n;
}

// The four parallel lists of the legacy format, a token at a time.
struct LegacyLogprobs {
    Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
         text_offset = Json::array();

    // `piece` as the text has it; `lp` its logprobs (null: none, as for the first prompt token),
    // of which the `top` most likely alternatives are listed by piece, the token's own added.
    void add(const Tokenizer& tok, const std::string& piece, const TokenLogprob* lp, int top, int* offset) {
        tokens.push_back(piece);
        text_offset.push_back(*offset);
        *offset += utf8_chars(piece);
        if (!lp) {
            token_logprobs.push_back(nullptr);
            top_logprobs.push_back(nullptr);
            return;
        }
        token_logprobs.push_back(logprob_value(lp->logprob));
        Json alternatives = Json::object();
        for (size_t i = 0; i < lp->top.size() && static_cast<int>(i) < top; ++i) {
            const auto& [id, v] = lp->top[i];
            if (!tok.valid_id(id)) continue;
            const std::string& key = id == lp->token ? piece : tok.piece(id);  // as `tokens` shows it
            if (!alternatives.contains(key)) alternatives[key] = logprob_value(v);
        }
        if (!alternatives.contains(piece)) alternatives[piece] = logprob_value(lp->logprob);
        top_logprobs.push_back(std::move(alternatives));
    }

    Json json() && {
        Json j;
        j["tokens"] = std::move(tokens);
        j["token_logprobs"] = std::move(token_logprobs);
        j["top_logprobs"] = std::move(top_logprobs);
        j["text_offset"] = std::move(text_offset);
        return j;
    }
};

// Prompt token i's logprobs (prompt_lps holds those of tokens 1..), null when there are none.
const TokenLogprob* prompt_logprob_at(const std::vector<TokenLogprob>& prompt_lps, size_t i) {
    return i >= 1 && i - 1 < prompt_lps.size() ? &prompt_lps[i - 1] : nullptr;
}

}  // namespace

Json completion_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                              const std::vector<TokenLogprob>& prompt_lps, const std::vector<TokenLogprob>& lps,
                              int top, int* offset) {
    LegacyLogprobs out;
    bool first = true;
    for (size_t i = 0; i < prompt_ids.size(); ++i) {
        const int32_t id = prompt_ids[i];
        // The echoed text is the prompt as given: without the special tokens the tokenizer added
        // (BOS) and, from SentencePiece, without the space its first piece starts with.
        if (!tok.valid_id(id) || tok.is_special(id)) continue;
        std::string piece = tok.piece(id);
        if (first && tok.strips_leading_space() && piece.starts_with(' ')) piece.erase(0, 1);
        first = false;
        out.add(tok, piece, prompt_logprob_at(prompt_lps, i), top, offset);
    }
    for (const TokenLogprob& lp : lps)
        out.add(tok, tok.valid_id(lp.token) ? tok.piece(lp.token) : std::string(), &lp, top, offset);
    return std::move(out).json();
}

Json prompt_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                          const std::vector<TokenLogprob>& prompt_lps, int top) {
    Json out = Json::array();
    auto entry = [&](int32_t id, float logprob, int rank) {
        return Json{{"logprob", logprob_value(logprob)},
                    {"rank", rank},
                    {"decoded_token", tok.valid_id(id) ? tok.piece(id) : std::string()}};
    };
    for (size_t i = 0; i < prompt_ids.size(); ++i) {
        const TokenLogprob* lp = prompt_logprob_at(prompt_lps, i);
        if (!lp) {
            out.push_back(nullptr);
            continue;
        }
        Json position = Json::object();  // keyed by token id, the prompt's token first
        position[std::to_string(lp->token)] = entry(lp->token, lp->logprob, lp->rank);
        for (size_t k = 0; k < lp->top.size() && static_cast<int>(k) < top; ++k) {
            const std::string key = std::to_string(lp->top[k].first);
            if (!position.contains(key))
                position[key] = entry(lp->top[k].first, lp->top[k].second, static_cast<int>(k) + 1);
        }
        out.push_back(std::move(position));
    }
    return out;
}

Json chat_logprobs_content(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int top_logprobs) {
    Json content = Json::array();
    for (const TokenLogprob& lp : lps) {
        const std::string& piece = tok.valid_id(lp.token) ? tok.piece(lp.token) : std::string();
        Json e;
        e["token"] = piece;
        e["logprob"] = logprob_value(lp.logprob);
        e["bytes"] = byte_list(piece);
        Json top = Json::array();
        for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top_logprobs; ++i) {
            const auto& [id, v] = lp.top[i];
            const std::string& p = tok.valid_id(id) ? tok.piece(id) : std::string();
            top.push_back({{"token", p}, {"logprob", logprob_value(v)}, {"bytes", byte_list(p)}});
        }
        e["top_logprobs"] = std::move(top);
        content.push_back(std::move(e));
    }
    return content;
}

std::string random_hex_id() {
    thread_local std::mt19937_64 rng{std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)};
    static const char* hex = "0123456789abcdef";
    std::string s(24, '0');
    uint64_t a = rng(), b = rng();
    for (int i = 0; i < 16; ++i) s[i] = hex[(a >> (4 * i)) & 15];
    for (int i = 16; i < 24; ++i) s[i] = hex[(b >> (4 * (i - 16))) & 15];
    return s;
}

Json stop_reason_json(const std::string& s, const SamplingParams& sp) {
    if (s.empty()) return nullptr;
    for (const std::string& stop : sp.stop)
        if (stop == s) return s;
    try {
        size_t used = 0;
        const long v = std::stol(s, &used);
        if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    return s;
}

}  // namespace peregrine::server
