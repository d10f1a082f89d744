// `peregrine chat-template`: render a model's chat template for a conversation, byte for byte.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "template/chat_template.h"

namespace peregrine::cli {

namespace {

struct ChatTemplateArgs {
    std::string model;
    std::string tokenizer_config;
    std::string chat_template;
    std::string context_json;
    std::string messages;
    std::string tools;
    std::string extra;
    std::string bos_token;
    std::string eos_token;
    std::string date;
    bool add_generation_prompt = false;
    bool bos_given = false;
    bool eos_given = false;
};

std::string read_all(const std::string& path) {
    if (path == "-") {
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        return ss.str();
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(path, ": cannot open");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// JSON given inline, or `@FILE` (`@-`: stdin).
nlohmann::ordered_json parse_json_arg(const std::string& what, const std::string& arg) {
    const std::string text = !arg.empty() && arg[0] == '@' ? read_all(arg.substr(1)) : arg;
    auto j = nlohmann::ordered_json::parse(text, nullptr, false);
    if (j.is_discarded()) fail(what, ": not valid JSON");
    return j;
}

std::tm parse_date(const std::string& s) {
    std::tm t{};
    std::istringstream in(s);
    in >> std::get_time(&t, "%Y-%m-%d");
    if (in.fail()) fail("--date: expected YYYY-MM-DD, got '", s, "'");
    t.tm_isdst = -1;
    std::mktime(&t);  // fills in the weekday and day of the year
    return t;
}

int run(const ChatTemplateArgs& a) {
    const int sources = !a.model.empty() + !a.tokenizer_config.empty() + !a.chat_template.empty();
    if (sources != 1) fail("chat-template needs exactly one of --model, --tokenizer-config, --template");
    const ChatTemplate t = !a.model.empty()              ? ChatTemplate::from_model(a.model)
                           : !a.tokenizer_config.empty() ? ChatTemplate::from_tokenizer_config(a.tokenizer_config)
                                                         : ChatTemplate::from_file(a.chat_template);

    nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
    if (!a.context_json.empty()) {
        ctx = parse_json_arg("--context-json", "@" + a.context_json);
        if (!ctx.is_object()) fail("--context-json: expected a JSON object");
    } else {
        ctx["messages"] = nlohmann::ordered_json::array();
        ctx["add_generation_prompt"] = false;
        ctx["bos_token"] = t.bos_token();
        ctx["eos_token"] = t.eos_token();
    }
    if (!a.messages.empty()) {
        ctx["messages"] = parse_json_arg("--messages", a.messages);
        if (!ctx["messages"].is_array()) fail("--messages: expected a JSON array of messages");
    } else if (a.context_json.empty()) {
        fail("chat-template needs --messages or --context-json");
    }
    if (a.add_generation_prompt) ctx["add_generation_prompt"] = true;
    if (a.bos_given) ctx["bos_token"] = a.bos_token;
    if (a.eos_given) ctx["eos_token"] = a.eos_token;
    if (!a.tools.empty()) ctx["tools"] = parse_json_arg("--tools", a.tools);
    if (!a.extra.empty()) {
        const auto extra = parse_json_arg("--vars", a.extra);
        if (!extra.is_object()) fail("--vars: expected a JSON object");
        for (const auto& [k, v] : extra.items()) ctx[k] = v;
    }

    jinja::Context functions;
    if (!a.date.empty()) {
        const std::tm date = parse_date(a.date);
        define_strftime_now(functions, [date] { return date; });
    }
    std::string out;
    try {
        out = t.render_context(ctx, functions);
    } catch (const jinja::RaisedError& e) {
        std::fflush(stdout);
        std::cerr << e.what() << "\n";  // exactly the template's message
        return 1;
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    return 0;
}

}  // namespace

std::function<int()> add_chat_template(CLI::App& app) {
    auto args = std::make_shared<ChatTemplateArgs>();
    CLI::App* cmd = app.add_subcommand(
        "chat-template", "Render a chat template for a conversation; prints the prompt byte for byte (no newline)");
    cmd->add_option("--model", args->model, "Model folder (tokenizer_config.json / chat_template.jinja) or GGUF file");
    cmd->add_option("--tokenizer-config", args->tokenizer_config, "tokenizer_config.json with a chat_template");
    cmd->add_option("--template,--chat-template", args->chat_template,
                    "Template file: a .jinja file or a tokenizer_config.json");
    cmd->add_option("--context-json", args->context_json,
                    "JSON file with all the template's variables (messages, add_generation_prompt, bos_token, ...)");
    cmd->add_option("--messages", args->messages, "Messages: a JSON array, or @FILE (@- for stdin)");
    cmd->add_option("--tools", args->tools, "Tools: a JSON array, or @FILE");
    cmd->add_option("--vars", args->extra,
                    "More variables: a JSON object, or @FILE (e.g. {\"enable_thinking\": false})");
    cmd->add_flag("--add-generation-prompt", args->add_generation_prompt, "End with the assistant turn's header");
    auto* bos = cmd->add_option("--bos-token", args->bos_token, "bos_token (default: the model's)");
    auto* eos = cmd->add_option("--eos-token", args->eos_token, "eos_token (default: the model's)");
    cmd->add_option("--date", args->date,
                    "Define strftime_now() with this date (YYYY-MM-DD); by default it is undefined");
    return [args, bos, eos] {
        args->bos_given = bos->count() > 0;
        args->eos_given = eos->count() > 0;
        return run(*args);
    };
}

}  // namespace peregrine::cli
