#include "server/openai/tool_call_stream.h"

#include "server/openai/response_json.h"

namespace peregrine::server {

std::optional<ToolCallSetup> tool_call_setup(const CompletionParams& p, ToolCallFormat served) {
    if (p.forced_tool_calls) return ToolCallSetup{ToolCallFormat::Forced, {}, false, true};
    if (!p.parse_tool_calls || served == ToolCallFormat::None) return std::nullopt;
    return ToolCallSetup{served, p.tool_names, !p.parallel_tool_calls, false};
}

ChoiceToolCalls::ChoiceToolCalls(const ToolCallSetup& setup) : parser_(setup.format, setup.names, setup.one_call) {}

ToolCallDelta ChoiceToolCalls::feed(std::string_view text, bool last) {
    ToolCallDelta d = parser_.feed(text);
    if (last) append_delta(d, parser_.finish());
    for (const ToolCallPiece& p : d.pieces) {
        if (p.call < 0) continue;
        if (!p.name.empty()) calls_.push_back({"call_" + random_hex_id(), p.name, {}});
        calls_[static_cast<size_t>(p.call)].arguments += p.text;
    }
    return d;
}

}  // namespace peregrine::server
