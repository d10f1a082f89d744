#include "server/grpc/proto_convert.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "server/openai/json_fields.h"

namespace peregrine::server {

namespace pb = ::peregrine::v1;

namespace {

// A status message travels in the HTTP/2 trailers, whose size is limited (8-16 KiB): one that
// echoes a large client input would wedge the connection. Cut to 1 KiB.
std::string status_message(std::string m) {
    constexpr size_t kMax = 1024;
    if (m.size() > kMax) {
        m.resize(kMax);
        while (!m.empty() && (static_cast<unsigned char>(m.back()) & 0xC0) == 0x80) m.pop_back();  // whole UTF-8
        if (!m.empty() && static_cast<unsigned char>(m.back()) >= 0xC0) m.pop_back();
        m += "...";
    }
    return m;
}

// The request's tools as the HTTP API's JSON body has them, read by the same parse_tools.
Json tools_body(const pb::GenerateRequest& req) {
    Json body = Json::object();
    if (req.tools_size() > 0) {
        Json tools = Json::array();
        for (const pb::Tool& t : req.tools()) {
            Json f = {{"name", t.name()}};
            if (!t.description().empty()) f["description"] = t.description();
            if (!t.parameters().empty()) {
                f["parameters"] = Json::parse(t.parameters(), nullptr, false);
                if (f["parameters"].is_discarded())
                    bad_param("tools", "the parameters of '", t.name(), "' are not JSON text");
            }
            tools.push_back({{"type", "function"}, {"function", std::move(f)}});
        }
        body["tools"] = std::move(tools);
    }
    const std::string& choice = req.tool_choice();
    if (choice == "auto" || choice == "none" || choice == "required")
        body["tool_choice"] = choice;
    else if (!choice.empty())
        body["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice}}}};
    if (req.has_parallel_tool_calls()) body["parallel_tool_calls"] = req.parallel_tool_calls();
    return body;
}

}  // namespace

CompletionParams completion_params_from_proto(const pb::GenerateRequest& req, const SamplingLimits& limits,
                                              const SamplingParams& defaults) {
    const bool chat = req.messages_size() > 0;
    const int given = (chat ? 1 : 0) + (req.prompt_ids_size() > 0 ? 1 : 0) + (req.prompt().empty() ? 0 : 1);
    if (given != 1) bad_param("prompt", "exactly one of 'prompt', 'prompt_ids' or 'messages' is required");
    CompletionParams c;
    c.sampling = defaults;
    c.endpoint = chat ? Endpoint::ChatCompletions : Endpoint::Completions;
    c.model = req.model();
    c.stream = true;  // Generate always streams
    if (chat) {
        c.messages = chat_messages_json(req.messages());
        c.add_special_tokens = false;  // the template adds them
    } else if (req.prompt_ids_size() > 0) {
        PromptInput in{false, {}, {}};
        in.ids.reserve(req.prompt_ids_size());
        for (uint32_t id : req.prompt_ids()) {
            if (id > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()))
                bad_param("prompt", "'prompt' token id ", id, " is out of range");
            in.ids.push_back(static_cast<int32_t>(id));
        }
        c.prompts.push_back(std::move(in));
    } else {
        c.prompts.push_back({true, req.prompt(), {}});
    }

    SamplingParams& s = c.sampling;
    c.max_tokens_given = req.max_tokens() > 0;
    if (c.max_tokens_given)
        s.max_tokens = saturate_int(req.max_tokens());
    else
        s.max_tokens = chat ? std::numeric_limits<int>::max() : 16;  // the engine clamps
    if (req.has_temperature()) s.temperature = req.temperature();
    if (req.has_top_p()) s.top_p = req.top_p();
    if (req.top_k() != 0) s.top_k = saturate_int(req.top_k());  // 0 (unset): the default, none unless the model's
    if (req.has_seed()) s.seed = req.seed();
    s.ignore_eos = req.ignore_eos();
    s.stop.assign(req.stop().begin(), req.stop().end());
    if (req.n() > 0) s.n = saturate_int(req.n());
    if (req.has_logprobs()) {
        s.logprobs = saturate_int(req.logprobs());
        c.chat_logprobs = chat;
    }
    c.priority = std::clamp(req.priority(), -1'000'000, 1'000'000);
    c.prompt_cache_key = req.prompt_cache_key();
    switch (req.structured_case()) {
        case pb::GenerateRequest::kJsonSchema:
            s.structured = structured_output_of("json", Json(req.json_schema()), "json_schema");
            break;
        case pb::GenerateRequest::kRegex:
            s.structured = structured_output_of("regex", Json(req.regex()), "regex");
            break;
        case pb::GenerateRequest::kChoice:
            s.structured = structured_output_of(
                "choice", Json(std::vector<std::string>(req.choice().choices().begin(), req.choice().choices().end())),
                "choice");
            break;
        case pb::GenerateRequest::kGrammar:
            s.structured = structured_output_of("grammar", Json(req.grammar()), "grammar");
            break;
        case pb::GenerateRequest::kJsonObject:
            s.structured = structured_output_of("json_object", Json(req.json_object()), "json_object");
            break;
        case pb::GenerateRequest::STRUCTURED_NOT_SET:
            break;
    }
    if (req.tools_size() > 0 && !chat) bad_param("tools", "'tools' need 'messages'");
    parse_tools(tools_body(req), c);
    check_sampling(c, limits);
    return c;
}

Json chat_messages_json(const google::protobuf::RepeatedPtrField<pb::ChatMessage>& messages) {
    Json out = Json::array();
    for (const pb::ChatMessage& m : messages) out.push_back({{"role", m.role()}, {"content", m.content()}});
    return out;
}

pb::GenerateResponse to_proto(const RequestOutput& o) {
    pb::GenerateResponse r;
    r.set_text(o.text);
    for (int32_t id : o.token_ids) r.add_token_ids(static_cast<uint32_t>(id));
    r.set_index(static_cast<uint32_t>(o.index));
    if (o.finish != FinishReason::None) r.set_finish_reason(finish_reason_name(o.finish));
    for (const TokenLogprob& lp : o.logprobs) {
        pb::TokenLogprob* t = r.add_logprobs();
        t->set_token_id(static_cast<uint32_t>(lp.token));
        t->set_logprob(lp.logprob);
        for (const auto& [id, v] : lp.top) {
            pb::TopLogprob* a = t->add_top();
            a->set_token_id(static_cast<uint32_t>(id));
            a->set_logprob(v);
        }
    }
    if (o.usage) {
        pb::Usage* u = r.mutable_usage();
        u->set_prompt_tokens(static_cast<uint32_t>(o.usage->prompt_tokens));
        u->set_completion_tokens(static_cast<uint32_t>(o.usage->completion_tokens));
        u->set_total_tokens(static_cast<uint32_t>(o.usage->prompt_tokens + o.usage->completion_tokens));
        u->set_cached_tokens(static_cast<uint32_t>(o.usage->cached_tokens));
    }
    return r;
}

void add_tool_calls(ChoiceToolCalls& tools, const RequestOutput& o, pb::GenerateResponse& r) {
    const bool last = o.finish != FinishReason::None;
    const ToolCallDelta d = tools.feed(o.text, last);
    r.set_text(d.content);
    for (const ToolCallPiece& p : d.pieces) {
        if (p.call < 0) continue;
        pb::ToolCallDelta* t = r.add_tool_call_deltas();
        t->set_index(static_cast<uint32_t>(p.call));
        if (!p.name.empty()) {
            t->set_id(tools.id(p.call));
            t->set_name(p.name);
        }
        t->set_arguments(p.text);
    }
    if (!last) return;
    for (const ToolCall& c : tools.calls()) {
        pb::ToolCall* t = r.add_tool_calls();
        t->set_id(c.id);
        t->set_name(c.name);
        t->set_arguments(c.arguments);
    }
    if (!tools.calls().empty() && o.finish == FinishReason::Stop) r.set_finish_reason("tool_calls");
}

grpc::Status to_status(const ApiError& e) {
    grpc::StatusCode code = grpc::StatusCode::INTERNAL;
    switch (e.status()) {
        case 400:
        case 413:
        case 415:
            code = grpc::StatusCode::INVALID_ARGUMENT;
            break;
        case 401:
            code = grpc::StatusCode::UNAUTHENTICATED;
            break;
        case 404:
            code = grpc::StatusCode::NOT_FOUND;
            break;
        case 429:
            code = grpc::StatusCode::RESOURCE_EXHAUSTED;
            break;
        case 503:
            code = grpc::StatusCode::UNAVAILABLE;
            break;
        default:
            break;
    }
    return {code, status_message(e.param().empty() ? std::string(e.what()) : str_cat(e.param(), ": ", e.what()))};
}

}  // namespace peregrine::server
