#include "template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"

namespace peregrine {

namespace {

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(path, ": cannot open");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// bos_token / eos_token in tokenizer_config.json: a string or an AddedToken {"content": ...}.
std::string token_text(const nlohmann::ordered_json& config, const char* key) {
    auto it = config.find(key);
    if (it == config.end()) return {};
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object()) {
        auto c = it->find("content");
        if (c != it->end() && c->is_string()) return c->get<std::string>();
    }
    return {};
}

std::string gguf_token(const GgufFile& g, const char* id_key) {
    const GgufValue* id = g.find(id_key);
    const GgufValue* tokens = g.find("tokenizer.ggml.tokens");
    if (!id || !tokens || !gguf_type_is_integer(id->type)) return {};
    if (id->i < 0 || static_cast<size_t>(id->i) >= tokens->strings.size()) return {};
    return tokens->strings[static_cast<size_t>(id->i)];
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string name, std::string bos_token, std::string eos_token)
    : template_(std::move(source), std::move(name)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)) {}

ChatTemplate ChatTemplate::from_tokenizer_config_json(const nlohmann::ordered_json& config, const std::string& name) {
    if (!config.is_object()) fail(name, ": not a JSON object");
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) fail(name, ": no 'chat_template' field");
    std::string source;
    if (it->is_string()) {
        source = it->get<std::string>();
    } else if (it->is_array()) {
        const nlohmann::ordered_json* pick = nullptr;
        for (const auto& t : *it) {
            if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
            if (!pick) pick = &t;
            if (t.contains("name") && t["name"] == "default") {
                pick = &t;
                break;
            }
        }
        if (!pick) fail(name, ": 'chat_template' is a list without a {name, template} entry");
        source = (*pick)["template"].get<std::string>();
    } else {
        fail(name, ": 'chat_template' must be a string or a list of {name, template}");
    }
    return ChatTemplate(std::move(source), name, token_text(config, "bos_token"), token_text(config, "eos_token"));
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path) {
    const std::string text = read_file(path);
    auto j = nlohmann::ordered_json::parse(text, nullptr, false);
    if (j.is_discarded()) fail(path, ": not valid JSON");
    return from_tokenizer_config_json(j, path);
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& gguf) {
    const GgufValue* v = gguf.find("tokenizer.chat_template");
    if (!v) fail(gguf.path(), ": no 'tokenizer.chat_template' metadata");
    if (v->type != GgufType::STRING)
        fail(gguf.path(), ": metadata key 'tokenizer.chat_template' has type ", v->type_str(), ", expected string");
    return ChatTemplate(v->s, gguf.path() + ":tokenizer.chat_template", gguf_token(gguf, "tokenizer.ggml.bos_token_id"),
                        gguf_token(gguf, "tokenizer.ggml.eos_token_id"));
}

ChatTemplate ChatTemplate::from_file(const std::string& path) {
    std::string text = read_file(path);
    const auto first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '{') {
        auto j = nlohmann::ordered_json::parse(text, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.contains("chat_template"))
            return from_tokenizer_config_json(j, path);
    }
    return ChatTemplate(std::move(text), path);
}

ChatTemplate ChatTemplate::from_flag(const std::string& file_or_source, const std::string& bos_token,
                                     const std::string& eos_token) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(file_or_source, ec)) {
        ChatTemplate t = from_file(file_or_source);
        if (t.bos_token_.empty()) t.bos_token_ = bos_token;
        if (t.eos_token_.empty()) t.eos_token_ = eos_token;
        return t;
    }
    if (file_or_source.find('{') == std::string::npos)
        fail("--chat-template ", file_or_source, ": no such file, and not a template (it has no '{')");
    return ChatTemplate(file_or_source, "--chat-template", bos_token, eos_token);
}

std::string ChatTemplate::content_format() const {
    // `for part in message['content']` / `message.content`: the parts are iterated. A plain
    // `{{ message['content'] }}` reads a string.
    static const std::regex loop(
        R"(\{%-?\s*for\s+\w+\s+in\s+\w+\s*(\[\s*['"]content['"]\s*\]|\.content)\s*(\|[^%]*)?-?%\})");
    return std::regex_search(template_.source(), loop) ? "openai" : "string";
}

ChatTemplate ChatTemplate::from_model(const std::string& path) {
    namespace fs = std::filesystem;
    if (fs::is_directory(path)) {
        const fs::path dir(path);
        const fs::path config = dir / "tokenizer_config.json";
        const fs::path jinja = dir / "chat_template.jinja";
        if (fs::exists(jinja)) {
            ChatTemplate t(read_file(jinja.string()), jinja.string());
            if (fs::exists(config)) {  // bos/eos from the config beside it
                auto j = nlohmann::ordered_json::parse(read_file(config.string()), nullptr, false);
                if (!j.is_discarded() && j.is_object()) {
                    t.bos_token_ = token_text(j, "bos_token");
                    t.eos_token_ = token_text(j, "eos_token");
                }
            }
            return t;
        }
        if (!fs::exists(config)) fail(path, ": no tokenizer_config.json or chat_template.jinja in the model folder");
        return from_tokenizer_config(config.string());
    }
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) return from_gguf(GgufFile(path));
    return from_file(path);
}

std::string ChatTemplate::render(const ChatInputs& in, const jinja::Context& functions,
                                 const jinja::RenderLimits& limits) const {
    nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
    for (const auto& [k, v] : in.extra.items()) ctx[k] = v;
    ctx["messages"] = in.messages;
    ctx["add_generation_prompt"] = in.add_generation_prompt;
    ctx["bos_token"] = in.bos_token.empty() ? bos_token_ : in.bos_token;
    ctx["eos_token"] = in.eos_token.empty() ? eos_token_ : in.eos_token;
    if (!in.tools.is_null()) ctx["tools"] = in.tools;
    return render_context(ctx, functions, limits);
}

std::string ChatTemplate::render_context(const nlohmann::ordered_json& context, const jinja::Context& functions,
                                         const jinja::RenderLimits& limits) const {
    if (!context.is_object()) fail("the template context must be a JSON object");
    jinja::Context ctx = functions;
    for (const auto& [k, v] : context.items()) ctx.set_json(k, v);
    return template_.render(ctx, limits);
}

void define_strftime_now(jinja::Context& ctx, std::function<std::tm()> now) {
    ctx.set_function("strftime_now", [now = std::move(now)](jinja::CallArgs& a) -> jinja::Value {
        if (a.args.empty() || !a.args[0].is_string()) throw jinja::ValueError("strftime_now() takes a format string");
        const std::string& fmt = a.args[0].as_string();
        if (fmt.size() > 256) throw jinja::ValueError("strftime_now(): format too long");
        const std::tm t = now();
        char buf[1024];
        const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &t);
        return jinja::Value(std::string(buf, n));
    });
}

std::tm local_time_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    return tm;
}

}  // namespace peregrine
