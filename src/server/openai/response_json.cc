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

Json completion_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids,
                              const std::vector<TokenLogprob>& lps, int* offset) {
    Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
         text_offset = Json::array();
    bool first = true;
    for (int32_t id : prompt_ids) {
        // The echoed text is the prompt as given: without the special tokens the tokenizer added
        // (BOS) and, from SentencePiece, without the space its first piece starts with.
        if (!tok.valid_id(id) || tok.is_special(id)) continue;
        std::string piece = tok.piece(id);
        if (first && tok.strips_leading_space() && piece.starts_with(' ')) piece.erase(0, 1);
        first = false;
        tokens.push_back(piece);
        token_logprobs.push_back(nullptr);
        top_logprobs.push_back(nullptr);
        text_offset.push_back(*offset);
        *offset += static_cast<int>(piece.size());
    }
    for (const TokenLogprob& lp : lps) {
        const std::string& piece = tok.valid_id(lp.token) ? tok.piece(lp.token) : std::string();
        tokens.push_back(piece);
        token_logprobs.push_back(logprob_value(lp.logprob));
        Json top = Json::object();
        for (const auto& [id, v] : lp.top)
            if (tok.valid_id(id) && !top.contains(tok.piece(id))) top[tok.piece(id)] = logprob_value(v);
        if (!top.contains(piece)) top[piece] = logprob_value(lp.logprob);
        top_logprobs.push_back(std::move(top));
        text_offset.push_back(*offset);
        *offset += static_cast<int>(piece.size());
    }
    Json j;
    j["tokens"] = std::move(tokens);
    j["token_logprobs"] = std::move(token_logprobs);
    j["top_logprobs"] = std::move(top_logprobs);
    j["text_offset"] = std::move(text_offset);
    return j;
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
