// The tool calls of one choice of a chat answer, for every transport (SSE, WebSocket, gRPC): the
// choice's text goes through a ToolCallParser, as it streams or whole, and each call gets its id
// ("call_<hex>") when its first piece goes out. Two cases call tools:
//   forced  tool_choice "required" / named: the grammar wrote a JSON array of calls;
//   auto    the model's own format (the served --tool-call-parser) parsed out of its text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai/completion_request.h"
#include "server/openai/tool_parsers.h"

namespace peregrine::server {

// What a request's choices parse: nullopt when nothing (no tools, tool_choice "none", or "auto"
// while the served model has no tool-call format).
struct ToolCallSetup {
    ToolCallFormat format = ToolCallFormat::None;
    std::vector<std::string> names;  // auto: the request's tools (empty: any)
    bool one_call = false;           // auto without parallel_tool_calls
    bool forced = false;
};
std::optional<ToolCallSetup> tool_call_setup(const CompletionParams& p, ToolCallFormat served);

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // the call's argument pieces, joined
};

class ChoiceToolCalls {
  public:
    explicit ChoiceToolCalls(const ToolCallSetup& setup);

    // The choice's next text; `last`: it ended, what was held goes out (content, or calls as
    // written so far).
    ToolCallDelta feed(std::string_view text, bool last);
    const std::vector<ToolCall>& calls() const { return calls_; }
    // The id of call `index` (its first piece went out).
    const std::string& id(int index) const { return calls_[static_cast<size_t>(index)].id; }

  private:
    ToolCallParser parser_;
    std::vector<ToolCall> calls_;
};

}  // namespace peregrine::server
