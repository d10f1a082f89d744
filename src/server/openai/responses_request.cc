#include "server/openai/responses_request.h"

#include <span>
#include <string_view>

#include "core/error.h"
#include "server/openai/json_fields.h"

namespace peregrine::server {

namespace {

// Sampling and request fields the chat path reads under the same name (the Responses API has
// temperature, top_p, parallel_tool_calls, user, ...; the rest are vLLM's extras, which its
// Responses endpoint takes too).
constexpr std::string_view kPassedOn[] = {"model",
                                          "temperature",
                                          "top_p",
                                          "seed",
                                          "top_k",
                                          "min_p",
                                          "presence_penalty",
                                          "frequency_penalty",
                                          "repetition_penalty",
                                          "stop",
                                          "stop_token_ids",
                                          "ignore_eos",
                                          "logit_bias",
                                          "min_tokens",
                                          "priority",
                                          "cache_salt",
                                          "user",
                                          "metadata",
                                          "safety_identifier",
                                          "prompt_cache_key",
                                          "service_tier",
                                          "parallel_tool_calls",
                                          "chat_template_kwargs"};
// Read here.
constexpr std::string_view kOwn[] = {
    "input",      "instructions",   "max_output_tokens", "stream",     "store",     "text",
    "tools",      "tool_choice",    "include",           "truncation", "reasoning", "previous_response_id",
    "background", "max_tool_calls", "stream_options"};

bool listed(std::span<const std::string_view> fields, const std::string& key) {
    for (std::string_view f : fields)
        if (f == key) return true;
    return false;
}

// Refuses what asks for a feature this server does not have; accepts only the values that ask
// for nothing (OpenAI's defaults), so no field is silently ignored.
void refuse_unsupported(const Json& body) {
    for (const auto& [key, v] : body.items())
        if (!listed(kPassedOn, key) && !listed(kOwn, key))
            bad_param(key, "Unrecognized request argument supplied: ", key, " (not supported by /v1/responses here)");
    if (json_field(body, "previous_response_id"))
        bad_param("previous_response_id",
                  "'previous_response_id' is not supported: this server keeps no responses (store is always "
                  "false); send the whole conversation in 'input'");
    if (get_bool(body, "background").value_or(false)) bad_param("background", "'background': true is not supported");
    if (json_field(body, "max_tool_calls")) bad_param("max_tool_calls", "'max_tool_calls' is not supported");
    if (const Json* r = json_field(body, "reasoning"); r && !(r->is_object() && r->empty()))
        bad_param("reasoning", "'reasoning' options are not supported by this model server");
    if (auto t = get_string(body, "truncation"); t && *t != "disabled")
        bad_param("truncation", "'truncation' '", *t, "' is not supported; use 'disabled'");
    if (const Json* inc = json_field(body, "include"); inc && !(inc->is_array() && inc->empty()))
        bad_param("include", "'include' is not supported (no extra output is available)");
    (void)get_bool(body, "store");  // accepted either way: nothing is kept (the response says store false)
    if (const Json* so = json_field(body, "stream_options"); so && !so->is_object())
        bad_param("stream_options", "'stream_options' must be an object");
}

// A message's content: a string, or input_text / output_text parts joined.
std::string content_text(const Json& content, const std::string& where) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) bad_param(where, "'", where, "' must be a string or a list of text parts");
    std::string text;
    for (size_t i = 0; i < content.size(); ++i) {
        const Json& part = content[i];
        const std::string type = part.is_object() ? part.value("type", "") : "";
        const auto t = part.is_object() ? part.find("text") : part.end();
        if ((type != "input_text" && type != "output_text" && type != "text") || t == part.end() || !t->is_string())
            bad_param(where, "'", where, "[", i, "]': only input_text and output_text parts are supported, got ",
                      type.empty() ? std::string(json_type_name(part)) : "'" + type + "'");
        text += t->get<std::string>();
    }
    return text;
}

// The assistant message the next tool call joins: the last message when it is the assistant's.
Json& assistant_turn(Json& messages) {
    if (messages.empty() || messages.back().value("role", "") != "assistant")
        messages.push_back({{"role", "assistant"}, {"content", ""}});
    return messages.back();
}

Json messages_of(const Json& body) {
    Json messages = Json::array();
    if (auto instructions = get_string(body, "instructions"))
        messages.push_back({{"role", "system"}, {"content", *instructions}});
    const Json* input = json_field(body, "input");
    if (!input) bad_param("input", "'input' is required");
    if (input->is_string()) {
        messages.push_back({{"role", "user"}, {"content", input->get<std::string>()}});
        return messages;
    }
    if (!input->is_array()) bad_param("input", "'input' must be a string or a list of input items");
    if (input->empty()) bad_param("input", "'input' must not be empty");
    for (size_t i = 0; i < input->size(); ++i) {
        const Json& item = (*input)[i];
        const std::string where = str_cat("input[", i, "]");
        if (!item.is_object()) bad_param(where, "'", where, "' must be an object");
        const std::string type = item.value("type", item.contains("role") ? "message" : "");
        if (type == "message") {
            const std::string role = item.value("role", "");
            if (role != "user" && role != "system" && role != "developer" && role != "assistant")
                bad_param(where + ".role", "'", where,
                          ".role' must be 'user', 'system', 'developer' or 'assistant', got '", role, "'");
            const auto content = item.find("content");
            if (content == item.end()) bad_param(where + ".content", "'", where, ".content' is required");
            messages.push_back({{"role", role}, {"content", content_text(*content, where + ".content")}});
        } else if (type == "function_call") {
            auto call_id = get_string(item, "call_id");
            auto name = get_string(item, "name");
            auto arguments = get_string(item, "arguments");
            if (!call_id || !name || !arguments)
                bad_param(where, "'", where, "' (function_call) needs 'call_id', 'name' and 'arguments' strings");
            Json& turn = assistant_turn(messages);
            if (!turn.contains("tool_calls")) turn["tool_calls"] = Json::array();
            turn["tool_calls"].push_back(
                {{"id", *call_id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *arguments}}}});
        } else if (type == "function_call_output") {
            auto call_id = get_string(item, "call_id");
            const auto output = item.find("output");
            if (!call_id || output == item.end())
                bad_param(where, "'", where, "' (function_call_output) needs 'call_id' and 'output'");
            messages.push_back(
                {{"role", "tool"}, {"tool_call_id", *call_id}, {"content", content_text(*output, where + ".output")}});
        } else if (type == "item_reference") {
            bad_param(where, "'", where,
                      "': item_reference is not supported: this server keeps no responses; send the items "
                      "themselves (with the Vercel AI SDK: providerOptions.openai.store false)");
        } else {
            bad_param(where + ".type", "'", where, ".type' '", type,
                      "' is not supported; use message, function_call or function_call_output");
        }
    }
    return messages;
}

// text.format as chat's response_format.
Json response_format_of(const Json& text) {
    if (!text.is_object()) bad_param("text", "'text' must be an object");
    if (const Json* v = json_field(text, "verbosity"); v && *v != "medium")
        bad_param("text.verbosity", "'text.verbosity' other than 'medium' is not supported");
    for (const auto& [key, v] : text.items())
        if (key != "format" && key != "verbosity") bad_param("text." + key, "'text.", key, "' is not supported");
    const Json* format = json_field(text, "format");
    if (!format) return nullptr;
    if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string())
        bad_param("text.format", "'text.format' must be an object with a 'type'");
    const std::string type = (*format)["type"].get<std::string>();
    if (type == "text" || type == "json_object") return {{"type", type}};
    if (type != "json_schema")
        bad_param("text.format", "'text.format.type' '", type,
                  "' is not supported; use text, json_object or json_schema");
    const auto schema = format->find("schema");
    if (schema == format->end()) bad_param("text.format", "'text.format' of type json_schema needs a 'schema'");
    Json js = {{"name", format->value("name", "response")}, {"schema", *schema}};
    if (format->contains("strict")) js["strict"] = (*format)["strict"];
    return {{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

// Responses tools ({type, name, description, parameters, strict}) as chat's.
Json chat_tools_of(const Json& tools) {
    if (!tools.is_array()) bad_param("tools", "'tools' must be a list of function tools");
    Json out = Json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const Json& t = tools[i];
        const std::string type = t.is_object() ? t.value("type", "") : "";
        if (type != "function")
            bad_param("tools", "'tools[", i, "]': only tools of type 'function' are supported, got '", type, "'");
        Json fn = {{"name", t.value("name", "")}};
        for (const char* key : {"description", "parameters", "strict"})
            if (const Json* v = json_field(t, key)) fn[key] = *v;
        out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    return out;
}

Json chat_tool_choice_of(const Json& choice) {
    if (choice.is_string()) return choice;
    if (choice.is_object() && choice.value("type", "") == "function" && choice.contains("name"))
        return {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
    bad_param("tool_choice",
              "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}");
}

}  // namespace

ResponsesRequest parse_responses_request(const Json& body) {
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    ResponsesRequest r;
    Json& chat = r.chat_body;
    chat = Json::object();
    if (json_field(body, "model")) chat["model"] = body["model"];
    chat["messages"] = messages_of(body);
    refuse_unsupported(body);
    for (std::string_view key : kPassedOn)
        if (const Json* v = json_field(body, std::string(key).c_str())) chat[std::string(key)] = *v;
    if (const Json* v = json_field(body, "max_output_tokens")) chat["max_completion_tokens"] = *v;
    Json text = {{"format", {{"type", "text"}}}, {"verbosity", "medium"}};
    if (const Json* t = json_field(body, "text")) {
        Json format = response_format_of(*t);
        if (!format.is_null()) {
            chat["response_format"] = format;
            text["format"] = (*t)["format"];
        }
    }
    Json tools = Json::array();
    if (const Json* t = json_field(body, "tools")) {
        chat["tools"] = chat_tools_of(*t);
        tools = *t;
        // The echo names `strict` as OpenAI's does (the Responses API's default is true; the
        // grammar that forces calls is strict either way).
        for (Json& tool : tools)
            if (tool.is_object() && !tool.contains("strict")) tool["strict"] = true;
    }
    Json tool_choice = "auto";
    if (const Json* c = json_field(body, "tool_choice")) {
        chat["tool_choice"] = chat_tool_choice_of(*c);
        tool_choice = *c;
    }
    r.stream = get_bool(body, "stream").value_or(false);
    chat["stream"] = r.stream;
    if (r.stream) chat["stream_options"] = {{"include_usage", true}};  // usage goes into response.completed

    Json& e = r.echoed;
    e["instructions"] = body.value("instructions", Json(nullptr));
    e["max_output_tokens"] = body.value("max_output_tokens", Json(nullptr));
    e["metadata"] = body.value("metadata", Json::object());
    e["parallel_tool_calls"] = body.value("parallel_tool_calls", true);
    e["previous_response_id"] = nullptr;
    e["store"] = false;
    e["temperature"] = body.value("temperature", Json(nullptr));
    e["text"] = std::move(text);
    e["tool_choice"] = std::move(tool_choice);
    e["tools"] = std::move(tools);
    e["top_p"] = body.value("top_p", Json(nullptr));
    e["truncation"] = "disabled";
    if (auto user = get_string(body, "user")) e["user"] = *user;
    return r;
}

ApiError responses_error(const ApiError& e) {
    static const std::pair<const char*, const char*> kNames[] = {
        {"max_completion_tokens", "max_output_tokens"}, {"response_format", "text.format"}, {"messages", "input"}};
    std::string message = e.what(), param = e.param();
    for (const auto& [chat, responses] : kNames) {
        if (param == chat) param = responses;
        const std::string quoted = str_cat("'", chat, "'");
        for (size_t at; (at = message.find(quoted)) != std::string::npos;)
            message.replace(at, quoted.size(), str_cat("'", responses, "'"));
    }
    ApiError out(e.status(), message, param, e.code(), e.type());
    if (e.retry_after_s() > 0) out.with_retry_after(e.retry_after_s());
    return out;
}

}  // namespace peregrine::server
