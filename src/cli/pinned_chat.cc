#include "cli/pinned_chat.h"

#include <nlohmann/json.hpp>

#include "template/chat_template.h"

namespace peregrine::cli {

std::string render_pinned_chat(const std::string& messages_json, const std::string& chat_template,
                               const ModelInfo& model, const Tokenizer& tokenizer) {
    const auto text = [&](int32_t id) { return tokenizer.valid_id(id) ? tokenizer.token(id) : std::string(); };
    const ChatTemplate t = !chat_template.empty() ? ChatTemplate::from_flag(chat_template, text(tokenizer.bos_id()),
                                                                            text(tokenizer.eos_id()))
                           : model.gguf           ? ChatTemplate::from_gguf(*model.gguf)
                                                  : ChatTemplate::from_model(model.model_dir);
    ChatInputs in;
    in.messages = nlohmann::ordered_json::parse(messages_json);
    // As the server hands string content to a template that loops over content parts.
    if (t.content_format() == "openai")
        for (auto& m : in.messages)
            if (m.contains("content") && m["content"].is_string())
                m["content"] =
                    nlohmann::ordered_json::array({{{"type", "text"}, {"text", m["content"].get<std::string>()}}});
    return t.render(in);
}

}  // namespace peregrine::cli
