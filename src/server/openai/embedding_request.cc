#include "server/openai/embedding_request.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "server/api_error.h"
#include "server/openai/json_fields.h"

namespace peregrine::server {

EmbeddingParams parse_embedding_params(const Json& body) {
    EmbeddingParams p;
    if (const Json* m = json_field(body, "model")) {
        if (!m->is_string()) bad_param("model", "'model' must be a string");
        p.model = m->get<std::string>();
    }
    p.inputs = parse_prompts(body, "input");
    for (const PromptInput& in : p.inputs)
        if (in.is_text && in.text.empty()) bad_param("input", "'input' must not contain an empty string");
    const std::string format = get_string(body, "encoding_format").value_or("float");
    if (format != "float" && format != "base64")
        bad_param("encoding_format", "'encoding_format' must be \"float\" or \"base64\", got \"", format, "\"");
    p.base64 = format == "base64";
    if (const std::optional<int64_t> d = get_int(body, "dimensions")) {
        if (*d < 1) bad_param("dimensions", "'dimensions' must be at least 1, got ", *d);
        p.dimensions = static_cast<int>(std::min<int64_t>(*d, INT32_MAX));
    }
    p.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
    if (const std::optional<int64_t> pr = get_int(body, "priority"))
        p.priority = static_cast<int>(std::clamp<int64_t>(*pr, -1000000, 1000000));
    (void)get_string(body, "user");  // checked as a string, not used
    return p;
}

std::string base64_f32(const std::vector<float>& v) {
    static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string bytes(v.size() * 4, '\0');
    for (size_t i = 0; i < v.size(); ++i) {
        uint32_t u;
        std::memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>((u >> (8 * b)) & 0xff);  // little-endian
    }
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const size_t n = std::min<size_t>(3, bytes.size() - i);
        uint32_t w = 0;
        for (size_t k = 0; k < 3; ++k) w = (w << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
        for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kAlphabet[(w >> (18 - 6 * k)) & 63] : '=');
    }
    return out;
}

Json embeddings_json(const std::vector<std::vector<float>>& embeddings, bool base64, const std::string& model,
                     int prompt_tokens) {
    Json data = Json::array();
    for (size_t i = 0; i < embeddings.size(); ++i) {
        Json e;
        e["object"] = "embedding";
        e["index"] = i;
        if (base64)
            e["embedding"] = base64_f32(embeddings[i]);
        else
            e["embedding"] = embeddings[i];
        data.push_back(std::move(e));
    }
    Json j;
    j["object"] = "list";
    j["data"] = std::move(data);
    j["model"] = model;
    j["usage"] = {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}};
    return j;
}

}  // namespace peregrine::server
