// Chat templates: where a model's template comes from (tokenizer_config.json, GGUF metadata, a
// .jinja file) and how a conversation becomes a prompt.
//
//   ChatTemplate t = ChatTemplate::from_model("path/to/model");   // folder or .gguf
//   ChatInputs in;
//   in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
//   in.add_generation_prompt = true;
//   std::string prompt = t.render(in);
#pragma once

#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "template/jinja.h"

namespace peregrine {

class GgufFile;

struct ChatInputs {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    bool add_generation_prompt = false;
    // Empty: the template's own defaults (from tokenizer_config.json or the GGUF vocabulary).
    std::string bos_token;
    std::string eos_token;
    nlohmann::ordered_json tools;                                     // null: `tools` stays undefined
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables (enable_thinking, ...)
};

class ChatTemplate {
  public:
    ChatTemplate(std::string source, std::string name, std::string bos_token = {}, std::string eos_token = {});

    // tokenizer_config.json's `chat_template`: a string, or a list of {name, template} (the one named
    // "default", else the first). Its bos_token / eos_token (strings or {"content": ...}) become the defaults.
    static ChatTemplate from_tokenizer_config(const std::string& path);
    static ChatTemplate from_tokenizer_config_json(const nlohmann::ordered_json& config, const std::string& name);
    // GGUF `tokenizer.chat_template`; bos/eos from tokenizer.ggml.{bos,eos}_token_id.
    static ChatTemplate from_gguf(const GgufFile& gguf);
    // A .jinja file, or a JSON file with a `chat_template` field (tokenizer_config.json).
    static ChatTemplate from_file(const std::string& path);
    // A model folder (its tokenizer_config.json, or chat_template.jinja beside it) or a .gguf file.
    static ChatTemplate from_model(const std::string& path);
    // vLLM's --chat-template: a file (as from_file) when one is there, else the template itself
    // (it must then look like one: contain '{'). bos/eos: the defaults when the source sets none.
    static ChatTemplate from_flag(const std::string& file_or_source, const std::string& bos_token,
                                  const std::string& eos_token);

    // How the template reads message content (vLLM's --chat-template-content-format auto):
    // "openai" when it loops over a message's content (a list of parts), else "string".
    std::string content_format() const;

    // messages (+ tools, extra) -> prompt. Errors: Error naming the template, line and column;
    // raise_exception gives jinja::RaisedError with the template's message.
    std::string render(const ChatInputs& in, const jinja::Context& functions = {},
                       const jinja::RenderLimits& limits = {}) const;
    // Renders with exactly the variables of `context` (a JSON object), plus `functions`.
    std::string render_context(const nlohmann::ordered_json& context, const jinja::Context& functions = {},
                               const jinja::RenderLimits& limits = {}) const;

    const jinja::Template& tmpl() const { return template_; }
    const std::string& bos_token() const { return bos_token_; }
    const std::string& eos_token() const { return eos_token_; }

  private:
    jinja::Template template_;
    std::string bos_token_;
    std::string eos_token_;
};

// Defines `strftime_now(format)` in `ctx`, formatting the time `now()` returns (C strftime, "C" locale).
void define_strftime_now(jinja::Context& ctx, std::function<std::tm()> now);
// Local time now: what the server uses.
std::tm local_time_now();

}  // namespace peregrine
