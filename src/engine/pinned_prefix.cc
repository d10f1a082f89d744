#include "engine/pinned_prefix.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace peregrine {

std::vector<std::vector<int32_t>> pinned_prefix_tokens(const std::vector<std::string>& files,
                                                       const EngineConfig& config, const ModelInfo& model,
                                                       const Tokenizer& tokenizer) {
    std::vector<std::vector<int32_t>> out;
    for (const std::string& file : files) {
        std::ifstream in(file, std::ios::binary);
        if (!in) fail("--pin-prefix ", file, ": cannot read it");
        std::stringstream buf;
        buf << in.rdbuf();
        const std::string text = buf.str();
        if (text.empty()) fail("--pin-prefix ", file, ": the file is empty");
        const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object()) {  // plain text (a JSON string or number is text too)
            out.push_back(tokenizer.encode(text, /*add_special_tokens=*/true, /*parse_special=*/true));
            continue;
        }
        const auto messages = j.find("messages");
        if (messages == j.end() || !messages->is_array() || messages->empty())
            fail("--pin-prefix ", file, ": a JSON file must be {\"messages\": [...]} with at least one message");
        if (!config.render_pinned_chat) fail("--pin-prefix ", file, ": this front end renders no chat messages");
        std::string prompt;
        try {
            prompt = config.render_pinned_chat(messages->dump(), model, tokenizer);
        } catch (const Error& e) {
            fail("--pin-prefix ", file, ": ", e.what());
        }
        out.push_back(tokenizer.encode(prompt, /*add_special_tokens=*/false, /*parse_special=*/true));
        if (out.back().empty()) fail("--pin-prefix ", file, ": the rendered conversation has no tokens");
    }
    return out;
}

}  // namespace peregrine
