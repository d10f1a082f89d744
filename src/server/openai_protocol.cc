#include "server/openai_protocol.h"

#include <cmath>
#include <limits>
#include <random>

#include "engine/sampler.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace peregrine::server {

namespace {

const char* type_name(const Json& v) {
    switch (v.type()) {
        case Json::value_t::null:
            return "null";
        case Json::value_t::boolean:
            return "a boolean";
        case Json::value_t::string:
            return "a string";
        case Json::value_t::array:
            return "an array";
        case Json::value_t::object:
            return "an object";
        case Json::value_t::number_float:
            return "a number";
        default:
            return "an integer";
    }
}

// Field readers: nullopt when the field is absent or null; 400 when it has the wrong type.
const Json* field(const Json& body, const char* key) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<double> get_number(const Json& body, const char* key) {
    const Json* v = field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad_param(key, "'", key, "' must be a number, got ", type_name(*v));
    const double d = v->get<double>();
    if (!std::isfinite(d)) bad_param(key, "'", key, "' must be finite");
    return d;
}

bool integral(const Json& v) {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15;
}

int64_t as_int64(const Json& v) {
    if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                              : static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    return static_cast<int64_t>(v.get<double>());
}

std::optional<int64_t> get_int(const Json& body, const char* key) {
    const Json* v = field(body, key);
    if (!v) return std::nullopt;
    if (!integral(*v)) bad_param(key, "'", key, "' must be an integer, got ", type_name(*v));
    return as_int64(*v);
}

// An int field within [lo, hi].
std::optional<int> get_int_in(const Json& body, const char* key, int64_t lo, int64_t hi) {
    auto v = get_int(body, key);
    if (!v) return std::nullopt;
    if (*v < lo || *v > hi) {
        if (hi == std::numeric_limits<int>::max()) bad_param(key, "'", key, "' must be at least ", lo, ", got ", *v);
        bad_param(key, "'", key, "' must be between ", lo, " and ", hi, ", got ", *v);
    }
    return static_cast<int>(*v);
}

std::optional<bool> get_bool(const Json& body, const char* key) {
    const Json* v = field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad_param(key, "'", key, "' must be a boolean, got ", type_name(*v));
    return v->get<bool>();
}

std::optional<std::string> get_string(const Json& body, const char* key) {
    const Json* v = field(body, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad_param(key, "'", key, "' must be a string, got ", type_name(*v));
    return v->get<std::string>();
}

std::vector<int32_t> token_list(const Json& v, const char* param) {
    std::vector<int32_t> ids;
    ids.reserve(v.size());
    for (const Json& t : v) {
        if (!integral(t)) bad_param(param, "'", param, "' token ids must be integers, got ", type_name(t));
        const int64_t id = as_int64(t);
        if (id < 0 || id > std::numeric_limits<int32_t>::max())
            bad_param(param, "'", param, "' token id ", id, " is out of range");
        ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
}

std::vector<PromptInput> parse_prompts(const Json& body) {
    const Json* p = field(body, "prompt");
    if (!p) bad_param("prompt", "'prompt' is required");
    std::vector<PromptInput> out;
    if (p->is_string()) {
        out.push_back({true, p->get<std::string>(), {}});
        return out;
    }
    if (!p->is_array())
        bad_param("prompt",
                  "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists");
    if (p->empty()) bad_param("prompt", "'prompt' must not be empty");
    const Json& first = (*p)[0];
    if (first.is_number()) {
        out.push_back({false, {}, token_list(*p, "prompt")});
        return out;
    }
    for (const Json& item : *p) {
        if (item.is_string()) {
            out.push_back({true, item.get<std::string>(), {}});
        } else if (item.is_array()) {
            if (item.empty()) bad_param("prompt", "'prompt' must not contain an empty list of token ids");
            out.push_back({false, {}, token_list(item, "prompt")});
        } else {
            bad_param("prompt", "'prompt' list items must be strings or lists of token ids, got ", type_name(item));
        }
    }
    return out;
}

std::vector<std::string> parse_stop(const Json& body) {
    const Json* v = field(body, "stop");
    std::vector<std::string> out;
    if (!v) return out;
    if (v->is_string()) {
        out.push_back(v->get<std::string>());
    } else if (v->is_array()) {
        for (const Json& s : *v) {
            if (!s.is_string()) bad_param("stop", "'stop' must be a string or a list of strings");
            out.push_back(s.get<std::string>());
        }
    } else {
        bad_param("stop", "'stop' must be a string or a list of strings, got ", type_name(*v));
    }
    for (const std::string& s : out)
        if (s.empty()) bad_param("stop", "'stop' strings must not be empty");
    return out;
}

std::vector<std::pair<int32_t, float>> parse_logit_bias(const Json& body) {
    const Json* v = field(body, "logit_bias");
    std::vector<std::pair<int32_t, float>> out;
    if (!v) return out;
    if (!v->is_object()) bad_param("logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto it = v->begin(); it != v->end(); ++it) {
        size_t used = 0;
        long long id = -1;
        try {
            id = std::stoll(it.key(), &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || used != it.key().size() || id < 0 || id > std::numeric_limits<int32_t>::max())
            bad_param("logit_bias", "'logit_bias' keys must be token ids, got '", it.key(), "'");
        if (!it.value().is_number()) bad_param("logit_bias", "'logit_bias' values must be numbers");
        const double b = it.value().get<double>();
        if (!(b >= -100.0 && b <= 100.0)) bad_param("logit_bias", "'logit_bias' values must be in [-100, 100]");
        out.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
    return out;
}

// Features not implemented yet: a clear 400 rather than silently ignoring them.
void refuse_unsupported(const Json& body, Endpoint endpoint) {
    if (const Json* rf = field(body, "response_format")) {
        if (!rf->is_object()) bad_param("response_format", "'response_format' must be an object");
        auto t = rf->find("type");
        if (t == rf->end() || !t->is_string()) bad_param("response_format", "'response_format' needs a 'type'");
        if (t->get<std::string>() != "text")
            bad_param("response_format", "response_format type '", t->get<std::string>(),
                      "' is not supported yet; only 'text' is");
    }
    if (const Json* tools = field(body, "tools")) {
        if (!tools->is_array() || !tools->empty())
            bad_param("tools", "'tools' (function calling) is not supported yet");
    }
    if (const Json* fns = field(body, "functions")) {
        if (!fns->is_array() || !fns->empty()) bad_param("functions", "'functions' is not supported yet");
    }
    if (endpoint == Endpoint::Completions) {
        if (auto suffix = get_string(body, "suffix"); suffix && !suffix->empty())
            bad_param("suffix", "'suffix' is not supported");
        if (auto best_of = get_int(body, "best_of")) {
            const int64_t n = get_int(body, "n").value_or(1);
            if (*best_of != n) bad_param("best_of", "'best_of' other than n is not supported");
        }
    }
}

}  // namespace

Json normalize_messages(const Json& messages) {
    if (!messages.is_array()) bad_param("messages", "'messages' must be a list of messages");
    if (messages.empty()) bad_param("messages", "'messages' must not be empty");
    Json out = Json::array();
    for (size_t i = 0; i < messages.size(); ++i) {
        const Json& m = messages[i];
        const std::string where = str_cat("messages[", i, "]");
        if (!m.is_object()) bad_param("messages", where, " must be an object");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string()) bad_param("messages", where, " needs a 'role' string");
        Json copy = m;
        auto content = m.find("content");
        if (content == m.end() || content->is_null()) {
            copy["content"] = "";
        } else if (content->is_array()) {
            std::string text;
            for (const Json& part : *content) {
                if (!part.is_object()) bad_param("messages", where, ".content parts must be objects");
                auto type = part.find("type");
                auto t = part.find("text");
                if (type == part.end() || *type != "text" || t == part.end() || !t->is_string())
                    bad_param("messages", where, ".content: only text parts are supported");
                text += t->get<std::string>();
            }
            copy["content"] = text;
        } else if (!content->is_string()) {
            bad_param("messages", where, ".content must be a string or a list of text parts");
        }
        out.push_back(std::move(copy));
    }
    return out;
}

CompletionParams parse_completion_params(const Json& body, Endpoint endpoint) {
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    CompletionParams c;
    c.endpoint = endpoint;
    const bool chat = endpoint == Endpoint::ChatCompletions;
    refuse_unsupported(body, endpoint);
    c.model = get_string(body, "model").value_or("");
    if (chat) {
        const Json* m = field(body, "messages");
        if (!m) bad_param("messages", "'messages' is required");
        c.messages = normalize_messages(*m);
    } else {
        c.prompts = parse_prompts(body);
    }

    SamplingParams& s = c.sampling;
    constexpr int kIntMax = std::numeric_limits<int>::max();
    // max_completion_tokens (chat's newer name) wins over max_tokens.
    std::optional<int> max_tokens;
    for (const char* key : {"max_tokens", "max_completion_tokens"}) {
        if (auto v = get_int(body, key)) {
            if (*v < 0) bad_param(key, "'", key, "' must be at least 0, got ", *v);
            max_tokens = static_cast<int>(std::min<int64_t>(*v, kIntMax));
            c.max_tokens_param = key;
            if (!chat && std::string(key) == "max_tokens") break;
        }
    }
    if (max_tokens) {
        c.max_tokens_given = true;
        s.max_tokens = *max_tokens;
    } else {
        s.max_tokens = chat ? kIntMax : 16;  // the engine clamps to the context left
    }
    if (auto v = get_number(body, "temperature")) {
        if (*v < 0) bad_param("temperature", "'temperature' must be at least 0, got ", *v);
        s.temperature = static_cast<float>(*v);
    }
    if (auto v = get_number(body, "top_p")) {
        if (!(*v > 0 && *v <= 1)) bad_param("top_p", "'top_p' must be in (0, 1], got ", *v);
        s.top_p = static_cast<float>(*v);
    }
    if (auto v = get_int(body, "top_k")) {
        if (*v < -1) bad_param("top_k", "'top_k' must be -1 or 0 (no limit) or positive, got ", *v);
        s.top_k = *v <= 0 ? 0 : static_cast<int>(std::min<int64_t>(*v, kIntMax));
    }
    if (auto v = get_number(body, "min_p")) {
        if (!(*v >= 0 && *v <= 1)) bad_param("min_p", "'min_p' must be in [0, 1], got ", *v);
        s.min_p = static_cast<float>(*v);
    }
    for (auto [key, dst] :
         {std::pair{"presence_penalty", &s.presence_penalty}, std::pair{"frequency_penalty", &s.frequency_penalty}}) {
        if (auto v = get_number(body, key)) {
            if (!(*v >= -2 && *v <= 2)) bad_param(key, "'", key, "' must be in [-2, 2], got ", *v);
            *dst = static_cast<float>(*v);
        }
    }
    if (auto v = get_number(body, "repetition_penalty")) {
        if (!(*v > 0)) bad_param("repetition_penalty", "'repetition_penalty' must be > 0, got ", *v);
        s.repetition_penalty = static_cast<float>(*v);
    }
    s.logit_bias = parse_logit_bias(body);
    if (auto v = get_int(body, "seed")) s.seed = static_cast<uint64_t>(*v);
    if (auto v = get_int_in(body, "n", 1, 128)) s.n = *v;
    s.stop = parse_stop(body);
    if (const Json* v = field(body, "stop_token_ids")) {
        if (!v->is_array()) bad_param("stop_token_ids", "'stop_token_ids' must be a list of token ids");
        s.stop_token_ids = token_list(*v, "stop_token_ids");
    }
    s.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    if (auto v = get_int_in(body, "min_tokens", 0, kIntMax)) s.min_tokens = *v;
    if (c.max_tokens_given && s.min_tokens > s.max_tokens)
        bad_param("min_tokens", "'min_tokens' (", s.min_tokens, ") must not exceed 'max_tokens' (", s.max_tokens, ")");

    c.stream = get_bool(body, "stream").value_or(false);
    if (const Json* so = field(body, "stream_options")) {
        if (!so->is_object()) bad_param("stream_options", "'stream_options' must be an object");
        c.include_usage = get_bool(*so, "include_usage").value_or(false);
    }
    if (chat) {
        c.chat_logprobs = get_bool(body, "logprobs").value_or(false);
        auto top = get_int_in(body, "top_logprobs", 0, kMaxLogprobs);
        if (top && !c.chat_logprobs) bad_param("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        s.logprobs = c.chat_logprobs ? top.value_or(0) : -1;
        c.add_special_tokens = get_bool(body, "add_special_tokens").value_or(false);
        c.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
        c.continue_final_message = get_bool(body, "continue_final_message").value_or(false);
        if (c.continue_final_message && c.add_generation_prompt && field(body, "add_generation_prompt"))
            bad_param("continue_final_message",
                      "'continue_final_message' and 'add_generation_prompt' exclude each other");
        if (c.continue_final_message) c.add_generation_prompt = false;
        if (const Json* k = field(body, "chat_template_kwargs")) {
            if (!k->is_object()) bad_param("chat_template_kwargs", "'chat_template_kwargs' must be an object");
            c.chat_template_kwargs = *k;
        }
    } else {
        c.echo = get_bool(body, "echo").value_or(false);
        if (const Json* v = field(body, "logprobs")) {
            if (v->is_boolean()) bad_param("logprobs", "'logprobs' must be an integer for /v1/completions");
            s.logprobs = get_int_in(body, "logprobs", 0, kMaxLogprobs).value();
        }
        c.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
        if (s.max_tokens == 0 && !c.echo) bad_param("max_tokens", "'max_tokens' must be at least 1 (0 only with echo)");
    }
    if (chat && s.max_tokens == 0) bad_param("max_tokens", "'max_tokens' must be at least 1, got 0");
    c.priority = static_cast<int>(std::clamp<int64_t>(get_int(body, "priority").value_or(0), -1'000'000, 1'000'000));
    c.cache_salt = get_string(body, "cache_salt").value_or("");
    (void)get_string(body, "user");
    (void)get_string(body, "prompt_cache_key");
    return c;
}

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
    for (int32_t id : prompt_ids) {
        const std::string& piece = tok.valid_id(id) ? tok.piece(id) : std::string();
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

}  // namespace peregrine::server
