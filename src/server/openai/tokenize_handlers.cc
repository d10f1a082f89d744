#include "server/api_error.h"
#include "server/openai/handlers.h"

namespace peregrine::server {

void handle_tokenize(CompletionService& service, ApiCall& call) {
    const Json& body = call.body;
    const ServedModel& m = *service.model();
    if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
        if (!it->is_string()) bad_param("model", "'model' must be a string");
        service.check_model(it->get<std::string>());
    }
    auto flag = [&](const char* key, bool def) {
        auto it = body.find(key);
        if (it == body.end() || it->is_null()) return def;
        if (!it->is_boolean()) bad_param(key, "'", key, "' must be a boolean");
        return it->get<bool>();
    };
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
        CompletionParams p;
        p.messages = normalize_messages(body["messages"]);
        p.add_generation_prompt = flag("add_generation_prompt", true);
        p.add_special_tokens = flag("add_special_tokens", false);
        if (auto k = body.find("chat_template_kwargs"); k != body.end() && k->is_object()) p.chat_template_kwargs = *k;
        if (auto t = body.find("chat_template"); t != body.end() && !t->is_null()) {  // as on /v1/chat/completions
            if (!t->is_string() || t->get<std::string>().empty())
                bad_param("chat_template", "'chat_template' must be a non-empty string");
            p.chat_template = t->get<std::string>();
        }
        ids = service.render_chat(p);
    } else {
        auto it = body.find("prompt");
        if (it == body.end() || !it->is_string()) bad_param("prompt", "'prompt' (a string) or 'messages' is required");
        ids = m.tokenizer->encode(it->get<std::string>(), flag("add_special_tokens", true), /*parse_special=*/true);
    }
    Json j;
    j["count"] = ids.size();
    j["max_model_len"] = m.max_model_len;
    j["tokens"] = ids;
    if (flag("return_token_strs", false)) {
        Json strs = Json::array();
        for (int32_t id : ids) strs.push_back(m.tokenizer->token(id));
        j["token_strs"] = strs;
    } else {
        j["token_strs"] = nullptr;
    }
    call.ex->respond(200, dump(j));
}

void handle_detokenize(CompletionService& service, ApiCall& call) {
    const Json& body = call.body;
    const ServedModel& m = *service.model();
    if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
        if (!it->is_string()) bad_param("model", "'model' must be a string");
        service.check_model(it->get<std::string>());
    }
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) bad_param("tokens", "'tokens' (a list of token ids) is required");
    std::vector<int32_t> ids;
    for (const Json& t : *it) {
        if (!t.is_number_integer()) bad_param("tokens", "'tokens' must hold integers");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= m.vocab_size)
            bad_param("tokens", "token id ", id, " is outside the vocabulary (0..", m.vocab_size - 1, ")");
        ids.push_back(static_cast<int32_t>(id));
    }
    call.ex->respond(200, dump(Json{{"prompt", m.tokenizer->decode(ids)}}));
}

}  // namespace peregrine::server
