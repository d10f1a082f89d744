#include "server/openai/completion_request.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <span>
#include <string_view>

#include "server/api_error.h"
#include "server/openai/json_fields.h"

namespace peregrine::server {

std::vector<PromptInput> parse_prompts(const Json& body, const char* field) {
    const Json* p = json_field(body, field);
    if (!p) bad_param(field, "'", field, "' is required");
    std::vector<PromptInput> out;
    if (p->is_string()) {
        out.push_back({true, p->get<std::string>(), {}});
        return out;
    }
    if (!p->is_array())
        bad_param(field, "'", field,
                  "' must be a string, a list of strings, a list of token ids or a list of such lists");
    if (p->empty()) bad_param(field, "'", field, "' must not be empty");
    const Json& first = (*p)[0];
    if (first.is_number()) {
        out.push_back({false, {}, get_token_ids(*p, field)});
        return out;
    }
    for (const Json& item : *p) {
        if (item.is_string()) {
            out.push_back({true, item.get<std::string>(), {}});
        } else if (item.is_array()) {
            if (item.empty()) bad_param(field, "'", field, "' must not contain an empty list of token ids");
            out.push_back({false, {}, get_token_ids(item, field)});
        } else {
            bad_param(field, "'", field, "' list items must be strings or lists of token ids, got ",
                      json_type_name(item));
        }
    }
    return out;
}

namespace {

std::vector<std::string> parse_stop(const Json& body) {
    const Json* v = json_field(body, "stop");
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
        bad_param("stop", "'stop' must be a string or a list of strings, got ", json_type_name(*v));
    }
    return out;
}

// Keys must be token ids, values numbers; the bias range is validate()'s.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const Json& body) {
    const Json* v = json_field(body, "logit_bias");
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
        out.emplace_back(static_cast<int32_t>(id), static_cast<float>(it.value().get<double>()));
    }
    return out;
}

// A count the API takes as 0..k while SamplingParams keeps -1 for "none": negative is refused here.
int non_negative(const char* key, int64_t v) {
    if (v < 0) bad_param(key, "'", key, "' must be at least 0, got ", v);
    return saturate_int(v);
}

// Every field the server reads for the endpoint; any other is refused with a 400 naming it
// (OpenAI's wording), never accepted and ignored. Sorted within each list.
constexpr std::string_view kCommonFields[] = {"cache_salt",
                                              "frequency_penalty",
                                              "guided_choice",
                                              "guided_grammar",
                                              "guided_json",
                                              "guided_regex",
                                              "ignore_eos",
                                              "logit_bias",
                                              "max_completion_tokens",
                                              "max_tokens",
                                              "metadata",
                                              "min_p",
                                              "min_tokens",
                                              "model",
                                              "n",
                                              "parallel_tool_calls",
                                              "presence_penalty",
                                              "priority",
                                              "prompt_cache_key",
                                              "prompt_logprobs",
                                              "repetition_penalty",
                                              "response_format",
                                              "safety_identifier",
                                              "seed",
                                              "service_tier",
                                              "stop",
                                              "stop_token_ids",
                                              "store",
                                              "stream",
                                              "stream_options",
                                              "structured_outputs",
                                              "temperature",
                                              "tool_choice",
                                              "tools",
                                              "top_k",
                                              "top_p",
                                              "user"};
constexpr std::string_view kChatFields[] = {
    "add_generation_prompt",  "add_special_tokens", "chat_template", "chat_template_kwargs",
    "continue_final_message", "logprobs",           "messages",      "top_logprobs"};
constexpr std::string_view kCompletionFields[] = {"add_special_tokens", "best_of", "echo",
                                                  "logprobs",           "prompt",  "suffix"};

bool listed(std::span<const std::string_view> fields, const std::string& key) {
    for (std::string_view f : fields)
        if (f == key) return true;
    return false;
}

// Fields the server knows but honours only in part: a clear 400 rather than silently ignoring them.
void refuse_unsupported(const Json& body, Endpoint endpoint) {
    for (const auto& [key, v] : body.items()) {
        const std::span<const std::string_view> own =
            endpoint == Endpoint::ChatCompletions ? std::span<const std::string_view>(kChatFields) : kCompletionFields;
        if (listed(kCommonFields, key) || listed(own, key)) continue;
        if (key == "functions" && v.is_array() && v.empty()) continue;  // legacy clients send an empty list
        const char* where = endpoint == Endpoint::ChatCompletions ? "/v1/chat/completions" : "/v1/completions";
        bad_param(key, "Unrecognized request argument supplied: ", key, " (not supported by ", where, " here)");
    }
    // Accepted only with the value that asks for nothing this server does not do.
    if (auto store = get_bool(body, "store"); store && *store)
        bad_param("store", "'store': true is not supported (this server keeps no completions)");
    if (auto tier = get_string(body, "service_tier"); tier && *tier != "auto" && *tier != "default")
        bad_param("service_tier", "'service_tier' '", *tier, "' is not supported; use 'auto' or 'default'");
    if (endpoint == Endpoint::Completions) {
        if (auto suffix = get_string(body, "suffix"); suffix && !suffix->empty())
            bad_param("suffix", "'suffix' is not supported");
        if (auto best_of = get_int(body, "best_of")) {
            const int64_t n = get_int(body, "n").value_or(1);
            if (*best_of != n) bad_param("best_of", "'best_of' other than n is not supported");
        }
    }
}

// `message` with the quoted field name `from` said as `to`.
std::string renamed(std::string message, const std::string& from, const std::string& to) {
    if (from == to) return message;
    const std::string quoted = str_cat("'", from, "'");
    if (const size_t at = message.find(quoted); at != std::string::npos)
        message.replace(at, quoted.size(), str_cat("'", to, "'"));
    return message;
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
        const std::string r = role->get<std::string>();
        if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool" && r != "function")
            bad_param("messages", where, ".role '", r,
                      "' is not one of 'system', 'developer', 'user', 'assistant', 'tool' and 'function'");
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
        // An assistant's earlier calls: OpenAI sends each call's arguments as JSON text; templates
        // write them with `| tojson` (Qwen, Llama 3.1) and need the object.
        if (auto calls = copy.find("tool_calls"); calls != copy.end() && calls->is_array()) {
            for (Json& call : *calls) {
                Json* fn = call.is_object() && call.contains("function") ? &call["function"] : &call;
                if (!fn->is_object() || !fn->contains("arguments") || !(*fn)["arguments"].is_string()) continue;
                Json args = Json::parse((*fn)["arguments"].get<std::string>(), nullptr, false);
                if (args.is_object()) (*fn)["arguments"] = std::move(args);
            }
        }
        out.push_back(std::move(copy));
    }
    return out;
}

StructuredOutput structured_output_of(const std::string& key, const Json& v, const std::string& field) {
    using Kind = StructuredOutput::Kind;
    const char* f = field.c_str();
    auto non_empty_string = [&] {
        if (!v.is_string() || v.get<std::string>().empty()) bad_param(f, "'", f, "' must be a non-empty string");
        return v.get<std::string>();
    };
    if (key == "json") {
        if (v.is_string()) {
            const Json parsed = Json::parse(v.get<std::string>(), nullptr, false);
            if (parsed.is_discarded()) bad_param(f, "'", f, "' is not valid JSON");
            return {Kind::JsonSchema, v.get<std::string>(), field};
        }
        if (!v.is_object() && !v.is_boolean()) bad_param(f, "'", f, "' must be a JSON schema (an object)");
        return {Kind::JsonSchema, v.dump(), field};
    }
    if (key == "regex") return {Kind::Regex, non_empty_string(), field};
    if (key == "grammar") return {Kind::Grammar, non_empty_string(), field};
    if (key == "choice") {
        bool strings = v.is_array() && !v.empty();
        for (const Json& c : v) strings = strings && c.is_string();
        if (!strings) bad_param(f, "'", f, "' must be a non-empty list of strings");
        return {Kind::Choice, v.dump(), field};
    }
    if (key == "json_object" && v.is_boolean())
        return v.get<bool>() ? StructuredOutput{Kind::JsonObject, "", field} : StructuredOutput{};
    bad_param(f, "'", f, "' field '", key, "' is not supported; use json, regex, choice, grammar or json_object");
}

namespace {

// Structured output: OpenAI's response_format (json_object, json_schema), vLLM's guided_json /
// guided_regex / guided_choice / guided_grammar and its newer structured_outputs object. At most
// one may ask; the engine compiles the grammar at submit (a 400 naming the field when it cannot).
StructuredOutput parse_structured_output(const Json& body) {
    using Kind = StructuredOutput::Kind;
    std::vector<StructuredOutput> asked;
    auto schema_text = [](const Json& v, const char* field) { return structured_output_of("json", v, field).spec; };
    if (const Json* rf = json_field(body, "response_format")) {
        if (!rf->is_object()) bad_param("response_format", "'response_format' must be an object");
        auto t = rf->find("type");
        if (t == rf->end() || !t->is_string()) bad_param("response_format", "'response_format' needs a 'type'");
        const std::string type = t->get<std::string>();
        if (type == "json_object") {
            asked.push_back({Kind::JsonObject, "", "response_format"});
        } else if (type == "json_schema") {
            auto js = rf->find("json_schema");
            if (js == rf->end() || !js->is_object())
                bad_param("response_format", "response_format type 'json_schema' needs a 'json_schema' object");
            auto schema = js->find("schema");
            if (schema == js->end()) bad_param("response_format", "'response_format.json_schema' needs a 'schema'");
            asked.push_back({Kind::JsonSchema, schema_text(*schema, "response_format"), "response_format"});
        } else if (type != "text") {
            bad_param("response_format", "response_format type '", type,
                      "' is not supported; use 'text', 'json_object' or 'json_schema'");
        }
    }
    for (const char* key : {"json", "regex", "choice", "grammar"}) {
        const std::string field = str_cat("guided_", key);
        if (const Json* v = json_field(body, field.c_str())) asked.push_back(structured_output_of(key, *v, field));
    }
    if (const Json* so = json_field(body, "structured_outputs")) {
        if (!so->is_object()) bad_param("structured_outputs", "'structured_outputs' must be an object");
        for (const auto& [key, v] : so->items()) {
            StructuredOutput one = structured_output_of(key, v, "structured_outputs");
            if (one.kind != Kind::None) asked.push_back(std::move(one));
        }
    }
    if (asked.size() > 1)
        bad_param(asked[1].field, "only one structured output may be asked for; got '", asked[0].field, "' and '",
                  asked[1].field, "'");
    return asked.empty() ? StructuredOutput{} : asked.front();
}

}  // namespace

// Chat `tools`, `tool_choice`, `parallel_tool_calls`. "required" or a named function: the
// answer must be calls, a JSON array of {"name", "arguments"} whose arguments follow each tool's
// parameters schema (one call without parallel_tool_calls); "none": the tools are only shown to
// the template; "auto" (the default with tools): the model's own call format is parsed out of the
// answer (tool_parsers.h), which a structured output may still constrain.
void parse_tools(const Json& body, CompletionParams& c) {
    const Json* tools = json_field(body, "tools");
    const Json* choice = json_field(body, "tool_choice");
    if (!tools || (tools->is_array() && tools->empty())) {
        if (choice && !(choice->is_string() && choice->get<std::string>() == "none"))
            bad_param("tool_choice", "'tool_choice' needs 'tools'");
        return;
    }
    if (!c.chat()) bad_param("tools", "'tools' are for /v1/chat/completions");
    if (!tools->is_array()) bad_param("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": ...}");
    Json calls = Json::array();  // the anyOf of one call per tool
    std::vector<std::string> names;
    for (const Json& t : *tools) {
        if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
            !t["function"].is_object())
            bad_param("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        const Json& f = t["function"];
        const std::string name = f.value("name", "");
        if (name.empty() || name.size() > 64 ||
            name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                std::string::npos)
            bad_param("tools", "a tool's function name must be 1-64 letters, digits, '_' or '-', got '", name, "'");
        if (std::find(names.begin(), names.end(), name) != names.end())
            bad_param("tools", "two tools are named '", name, "'");
        names.push_back(name);
        Json params =
            f.contains("parameters") ? f["parameters"] : Json{{"type", "object"}, {"properties", Json::object()}};
        if (!params.is_object()) bad_param("tools", "the parameters of '", name, "' must be a JSON schema object");
        calls.push_back({{"type", "object"},
                         {"properties", {{"name", {{"const", name}}}, {"arguments", params}}},
                         {"required", {"name", "arguments"}},
                         {"additionalProperties", false}});
    }
    c.tools = *tools;
    std::string mode = "auto";
    Json forced = calls;
    if (choice) {
        if (choice->is_string()) {
            mode = choice->get<std::string>();
            if (mode != "none" && mode != "auto" && mode != "required")
                bad_param("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a named function");
        } else if (choice->is_object() && choice->value("type", "") == "function" && choice->contains("function") &&
                   (*choice)["function"].is_object() && (*choice)["function"].value("name", "") != "") {
            const std::string name = (*choice)["function"]["name"].get<std::string>();
            const auto at = std::find(names.begin(), names.end(), name);
            if (at == names.end())
                bad_param("tool_choice", "'tool_choice' names '", name, "', which is not in 'tools'");
            mode = "named";
            forced = Json::array({calls[static_cast<size_t>(at - names.begin())]});
        } else {
            bad_param("tool_choice",
                      "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}");
        }
    }
    bool parallel = true;
    if (const Json* p = json_field(body, "parallel_tool_calls")) {
        if (!p->is_boolean()) bad_param("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
        parallel = p->get<bool>() && mode != "named";
    }
    if (mode == "auto") {
        c.tool_names = std::move(names);
        c.parse_tool_calls = true;
        c.parallel_tool_calls = parallel;
    }
    if (mode == "auto" || mode == "none") return;
    if (mode == "named") parallel = false;
    Json schema = {
        {"type", "array"}, {"minItems", 1}, {"items", forced.size() == 1 ? forced[0] : Json{{"anyOf", forced}}}};
    if (!parallel) schema["maxItems"] = 1;
    if (c.sampling.structured.kind != StructuredOutput::Kind::None)
        bad_param("tool_choice", "forced tool calls cannot be combined with '", c.sampling.structured.field, "'");
    c.sampling.structured = {StructuredOutput::Kind::JsonSchema, schema.dump(), "tools", /*compact=*/true};
    c.forced_tool_calls = true;
}

CompletionParams parse_completion_params(const Json& body, Endpoint endpoint, const SamplingLimits& limits,
                                         const SamplingParams& defaults) {
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    CompletionParams c;
    c.endpoint = endpoint;
    c.sampling = defaults;
    const bool chat = c.chat();
    c.model = get_string(body, "model").value_or("");
    if (chat) {
        const Json* m = json_field(body, "messages");
        if (!m) bad_param("messages", "'messages' is required");
        c.messages = normalize_messages(*m);
    } else {
        c.prompts = parse_prompts(body, "prompt");
    }
    refuse_unsupported(body, endpoint);  // after the required field: a missing one is the first thing to say

    SamplingParams& s = c.sampling;
    // max_completion_tokens (chat's newer name) wins over max_tokens.
    for (const char* key : {"max_tokens", "max_completion_tokens"}) {
        if (auto v = get_int(body, key)) {
            s.max_tokens = non_negative(key, *v);
            c.max_tokens_given = true;
            c.max_tokens_param = key;
            if (!chat && std::string(key) == "max_tokens") break;
        }
    }
    if (!c.max_tokens_given) s.max_tokens = chat ? std::numeric_limits<int>::max() : 16;  // the engine clamps
    if (auto v = get_number(body, "temperature")) s.temperature = static_cast<float>(*v);
    if (auto v = get_number(body, "top_p")) s.top_p = static_cast<float>(*v);
    if (auto v = get_int(body, "top_k")) s.top_k = *v == -1 ? 0 : saturate_int(*v);  // -1: no limit, as vLLM
    if (auto v = get_number(body, "min_p")) s.min_p = static_cast<float>(*v);
    if (auto v = get_number(body, "presence_penalty")) s.presence_penalty = static_cast<float>(*v);
    if (auto v = get_number(body, "frequency_penalty")) s.frequency_penalty = static_cast<float>(*v);
    if (auto v = get_number(body, "repetition_penalty")) s.repetition_penalty = static_cast<float>(*v);
    s.logit_bias = parse_logit_bias(body);
    s.structured = parse_structured_output(body);
    parse_tools(body, c);
    if (auto v = get_int(body, "seed")) s.seed = static_cast<uint64_t>(*v);
    if (auto v = get_int(body, "n")) s.n = saturate_int(*v);
    s.stop = parse_stop(body);
    if (const Json* v = json_field(body, "stop_token_ids")) {
        if (!v->is_array()) bad_param("stop_token_ids", "'stop_token_ids' must be a list of token ids");
        s.stop_token_ids = get_token_ids(*v, "stop_token_ids");
    }
    s.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    s.skip_special_tokens = get_bool(body, "skip_special_tokens").value_or(true);
    if (auto v = get_int(body, "min_tokens")) s.min_tokens = saturate_int(*v);

    c.stream = get_bool(body, "stream").value_or(false);
    if (const Json* so = json_field(body, "stream_options")) {
        if (!so->is_object()) bad_param("stream_options", "'stream_options' must be an object");
        c.include_usage = get_bool(*so, "include_usage").value_or(false);
    }
    if (chat) {
        c.chat_logprobs = get_bool(body, "logprobs").value_or(false);
        std::optional<int> top;
        if (auto v = get_int(body, "top_logprobs")) top = non_negative("top_logprobs", *v);
        if (top && !c.chat_logprobs) bad_param("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        s.logprobs = c.chat_logprobs ? top.value_or(0) : -1;
        c.add_special_tokens = get_bool(body, "add_special_tokens").value_or(false);
        c.add_generation_prompt = get_bool(body, "add_generation_prompt").value_or(true);
        c.continue_final_message = get_bool(body, "continue_final_message").value_or(false);
        if (c.continue_final_message && c.add_generation_prompt && json_field(body, "add_generation_prompt"))
            bad_param("continue_final_message",
                      "'continue_final_message' and 'add_generation_prompt' exclude each other");
        if (c.continue_final_message) c.add_generation_prompt = false;
        if (auto t = get_string(body, "chat_template")) {
            if (t->empty()) bad_param("chat_template", "'chat_template' must not be empty");
            c.chat_template = std::move(*t);
        }
        if (const Json* k = json_field(body, "chat_template_kwargs")) {
            if (!k->is_object()) bad_param("chat_template_kwargs", "'chat_template_kwargs' must be an object");
            c.chat_template_kwargs = *k;
        }
    } else {
        c.echo = get_bool(body, "echo").value_or(false);
        if (const Json* v = json_field(body, "logprobs")) {
            if (v->is_boolean()) bad_param("logprobs", "'logprobs' must be an integer for /v1/completions");
            s.logprobs = non_negative("logprobs", get_int(body, "logprobs").value());
        }
        c.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
    }
    // vLLM's prompt_logprobs: each prompt token's logprob and the top k, in the whole answer
    // only (as vLLM, not streamed). Echoed legacy logprobs need them too, `logprobs` deep.
    if (auto v = get_int(body, "prompt_logprobs")) {
        c.prompt_logprobs = non_negative("prompt_logprobs", *v);
        if (c.stream) bad_param("prompt_logprobs", "'prompt_logprobs' is not available when 'stream' is true");
    }
    s.prompt_logprobs = std::max(c.prompt_logprobs, c.echo ? s.logprobs : -1);
    c.priority = static_cast<int>(std::clamp<int64_t>(get_int(body, "priority").value_or(0), -1'000'000, 1'000'000));
    c.cache_salt = get_string(body, "cache_salt").value_or("");
    c.user = get_string(body, "user").value_or("");
    c.prompt_cache_key = get_string(body, "prompt_cache_key").value_or("");
    // Routing, abuse and bookkeeping hints for OpenAI's service; they change no answer here.
    if (const Json* md = json_field(body, "metadata"); md && !md->is_object())
        bad_param("metadata", "'metadata' must be an object");
    (void)get_string(body, "safety_identifier");
    check_sampling(c, limits);
    return c;
}

void check_sampling(const CompletionParams& c, const SamplingLimits& limits) {
    for (const FieldError& e : validate(c.sampling, limits)) {
        if (e.field == "max_tokens" && c.echo && c.sampling.max_tokens == 0) continue;  // the prompt only
        // Without max_tokens the engine clamps to the context left: min_tokens is not over it.
        if (e.field == "min_tokens" && !c.max_tokens_given && c.sampling.min_tokens >= 0) continue;
        std::string field = e.field;
        if (field == "max_tokens")
            field = c.max_tokens_param;
        else if (field == "logprobs" && c.chat())
            field = "top_logprobs";
        throw ApiError(400, renamed(e.message, e.field, field), field);
    }
}

}  // namespace peregrine::server
