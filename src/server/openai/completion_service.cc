#include "server/openai/completion_service.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "server/api_error.h"

namespace peregrine::server {

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

namespace {

// The engine refused a request (Engine::submit): a 400 naming the field when the message does
// (validate()'s messages start with the quoted field; a few older ones with the bare name).
ApiError engine_error(const Error& e, bool chat) {
    const std::string msg = e.what();
    auto starts = [&](const char* p) { return msg.rfind(p, 0) == 0; };
    if (starts("the engine is shutting down")) return ApiError(503, msg, "", "shutting_down");
    std::string param;
    if (starts("the prompt") || starts("prompt token")) {
        param = chat ? "messages" : "prompt";
    } else if (starts("'")) {
        param = msg.substr(1, msg.find('\'', 1) - 1);
        if (param == "logprobs" && chat) param = "top_logprobs";
    } else if (starts("logit_bias")) {
        param = "logit_bias";
    } else if (starts("stop strings")) {
        param = "stop";
    } else {
        for (const char* p : {"n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
                              "min_tokens", "logprobs"})
            if (starts(p) && msg.size() > std::strlen(p) && msg[std::strlen(p)] == ' ') param = p;
    }
    return ApiError(400, msg, param);
}

}  // namespace

CompletionService::CompletionService(OpenAiServerOptions options)
    : options_(std::move(options)),
      admission_(options_.limits, options_.rate_limits, options_.api_keys),
      started_(std::chrono::steady_clock::now()),
      created_unix_(unix_now()) {
    if (options_.model_names.empty()) options_.model_names.push_back("peregrine");
    define_strftime_now(template_functions_, local_time_now);
}

CompletionService::~CompletionService() {
    shutdown();
}

void CompletionService::set_model(std::unique_ptr<ServedModel> model) {
    model_ = std::move(model);
    if (model_->tokenizer)
        for (int32_t id = 0; id < model_->tokenizer->size(); ++id)
            model_->max_token_bytes = std::max(
                {model_->max_token_bytes, model_->tokenizer->token(id).size(), model_->tokenizer->piece(id).size()});
    ready_.store(true, std::memory_order_release);
}

void CompletionService::abort_all() {
    if (model_ && model_->engine) model_->engine->shutdown();
}

void CompletionService::shutdown() {
    abort_all();
    pump_.stop();
}

double CompletionService::uptime_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

void CompletionService::check_caller(const Caller& caller) const {
    admission_.check_caller(caller, ready(), draining());
}

void CompletionService::check_model(const std::string& name) const {
    if (name.empty()) return;
    for (const std::string& n : options_.model_names)
        if (n == name) return;
    // The name is the client's: echoed back cut short (a 100 KB name in a gRPC status wedged the
    // HTTP/2 connection: trailers have a size limit).
    const std::string shown = name.size() > 128 ? str_cat(name.substr(0, 128), "...") : name;
    throw ApiError(404, str_cat("The model '", shown, "' does not exist; this server serves '", model_name(), "'"),
                   "model", "model_not_found");
}

SamplingLimits CompletionService::sampling_limits() const {
    SamplingLimits limits;
    if (const ServedModel* m = model()) {
        limits.vocab_size = m->vocab_size;
        limits.has_tokenizer = m->tokenizer != nullptr;
    }
    return limits;
}

std::vector<int32_t> CompletionService::render_chat(const CompletionParams& p) const {
    const ServedModel& m = *model_;
    ChatInputs in;
    const ChatTemplate* tmpl = m.chat_template.get();
    std::optional<ChatTemplate> own;  // the request's chat_template, compiled for this request only
    const char* template_param = "messages";
    if (!p.chat_template.empty()) {
        try {
            own.emplace(p.chat_template, "chat_template");
        } catch (const Error& e) {
            throw ApiError(400, str_cat("'chat_template' is not a valid template: ", e.what()), "chat_template",
                           "chat_template_error");
        }
        tmpl = &*own;
        template_param = "chat_template";
        in.bos_token = m.bos_token;
        in.eos_token = m.eos_token;
    }
    if (!tmpl)
        throw ApiError(400,
                       str_cat("this model has no chat template (", m.chat_template_error,
                               "); start the server with --chat-template or send 'chat_template'"),
                       "messages", "no_chat_template");
    in.messages = p.messages;
    if (m.chat_template_content_format == "openai")
        for (auto& msg : in.messages)
            if (msg["content"].is_string())
                msg["content"] = Json::array({{{"type", "text"}, {"text", msg["content"].get<std::string>()}}});
    in.add_generation_prompt = p.add_generation_prompt;
    in.extra = p.chat_template_kwargs;
    if (!p.tools.is_null()) in.tools = nlohmann::ordered_json::parse(p.tools.dump());
    std::string prompt;
    try {
        prompt = tmpl->render(in, template_functions_);
    } catch (const jinja::RaisedError& e) {
        throw ApiError(400, e.what(), template_param, "chat_template_error");
    } catch (const Error& e) {
        throw ApiError(400, str_cat("the chat template failed on these messages: ", e.what()), template_param,
                       "chat_template_error");
    }
    if (p.continue_final_message) {
        // The prompt ends right after the final message's content: the model continues it.
        const Json& last = p.messages.back();
        const std::string content = last["content"].get<std::string>();
        const size_t at = content.empty() ? std::string::npos : prompt.rfind(content);
        if (at != std::string::npos) prompt.resize(at + content.size());
    }
    return encode_prompt(prompt, p.add_special_tokens, "messages");
}

std::vector<int32_t> CompletionService::encode_prompt(const std::string& text, bool add_special,
                                                      const char* param) const {
    const ServedModel& m = *model_;
    // No token is longer than max_token_bytes, so a text this long holds more tokens than the
    // context: refused before tokenizing (a 30 MiB prompt took ~300 MB to tokenize and reject).
    const size_t at_least = text.size() / std::max<size_t>(1, m.max_token_bytes);
    if (m.max_token_bytes > 0 && at_least >= static_cast<size_t>(m.max_model_len))
        throw ApiError(400,
                       str_cat("This model's maximum context length is ", m.max_model_len, " tokens, but the prompt (",
                               text.size(), " bytes) has at least ", at_least, " tokens"),
                       param, "context_length_exceeded");
    return m.tokenizer->encode(text, add_special, /*parse_special=*/true);
}

void CompletionService::check_generates() const {
    if (ready() && model_->pooling)
        throw ApiError(400,
                       str_cat("The model '", model_name(),
                               "' is served for embeddings (--task embed) and does not generate text: use POST "
                               "/v1/embeddings, or start the server without --task embed for completions and chat"),
                       "model", "model_does_not_support_generation");
}

Ticket CompletionService::admit_inputs(const Caller& caller, size_t num_inputs, const RequestCost& cost) const {
    try {
        admission_.check_shape(1, num_inputs);
        return admission_.admit(caller, cost);
    } catch (const ApiError& e) {  // the gate names completions' fields
        if (e.status() != 400 || e.param().empty()) throw;
        throw ApiError(e.status(), e.what(), "input", e.code(), e.type());
    }
}

AdmittedCompletion CompletionService::admit(const Caller& caller, CompletionParams params,
                                            const std::string& id) const {
    check_generates();
    const ServedModel& m = *model_;
    AdmittedCompletion out;
    out.params = std::move(params);
    const CompletionParams& p = out.params;
    check_model(p.model);
    admission_.check_shape(p.sampling.n, p.prompts.size());
    std::vector<std::vector<int32_t>> prompts;  // token ids, one list per prompt
    if (p.chat()) {
        prompts.push_back(render_chat(p));
    } else {
        for (const PromptInput& in : p.prompts) {
            if (in.is_text) {
                prompts.push_back(encode_prompt(in.text, p.add_special_tokens, "prompt"));
                out.echo_texts.push_back(p.echo ? in.text : std::string());  // read only for echo
            } else {
                for (int32_t t : in.ids)
                    if (!m.tokenizer->valid_id(t))
                        bad_param("prompt", "prompt token id ", t, " is outside the vocabulary (0..", m.vocab_size - 1,
                                  ")");
                prompts.push_back(in.ids);
                out.echo_texts.push_back(p.echo ? m.tokenizer->decode(in.ids) : std::string());
            }
        }
    }
    const char* prompt_param = p.chat() ? "messages" : "prompt";
    RequestCost cost;
    for (const auto& ids : prompts) {
        const int len = static_cast<int>(ids.size());
        if (len == 0) bad_param(prompt_param, "the prompt is empty");
        // vLLM's checks and wording. Without max_tokens a chat completion may fill the context;
        // a completion's default max_tokens (16) counts as asked for, as in vLLM.
        if (len >= m.max_model_len)
            throw ApiError(
                400,
                str_cat("This model's maximum context length is ", m.max_model_len, " tokens. However, you requested ",
                        len, " tokens in the messages, Please reduce the length of the messages."),
                prompt_param, "context_length_exceeded");
        if ((p.max_tokens_given || !p.chat()) && static_cast<int64_t>(len) + p.sampling.max_tokens > m.max_model_len)
            throw ApiError(
                400,
                str_cat("This model's maximum context length is ", m.max_model_len, " tokens. However, you requested ",
                        static_cast<int64_t>(len) + p.sampling.max_tokens, " tokens (", len, " in the messages, ",
                        p.sampling.max_tokens,
                        " in the completion). Please reduce the length of the messages or completion."),
                p.max_tokens_given ? p.max_tokens_param : std::string(prompt_param), "context_length_exceeded");
        // Each prompt once (its choices share it), plus the most each choice may generate.
        cost.sequences += p.sampling.n;
        cost.tokens += len + std::min<int64_t>(p.sampling.max_tokens, m.max_model_len - len) * p.sampling.n;
    }
    out.ticket = admission_.admit(caller, cost);
    out.requests.resize(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        Request& r = out.requests[i];
        r.id = prompts.size() == 1 ? id : str_cat(id, "-", i);
        r.prompt_ids = std::move(prompts[i]);
        r.sampling = p.sampling;
        // Echo of the prompt only (max_tokens 0) with its logprobs: the engine computes the
        // prompt and draws one token, which the answer leaves out (as vLLM does).
        if (r.sampling.max_tokens == 0 && r.sampling.prompt_logprobs >= 0) {
            r.sampling.max_tokens = 1;
            r.sampling.min_tokens = 0;
        }
        // Formats whose call marker is a special token need it in the text to find the call.
        if (p.parse_tool_calls &&
            (m.tool_call_format == ToolCallFormat::Mistral || m.tool_call_format == ToolCallFormat::Llama3Json))
            r.sampling.skip_special_tokens = false;
        r.priority = p.priority;
        r.cache_salt = p.cache_salt;
        r.prompt_cache_key = p.prompt_cache_key;
        r.group = id;  // the prompts of one call share one fair share of the running slots
    }
    return out;
}

std::vector<std::shared_ptr<RequestStream>> CompletionService::submit(const std::vector<Request>& requests,
                                                                      bool chat) const {
    std::vector<std::shared_ptr<RequestStream>> streams;
    streams.reserve(requests.size());
    for (const Request& r : requests) {
        try {
            streams.push_back(model_->engine->submit(r));
        } catch (const Error& e) {
            for (const auto& s : streams) model_->engine->abort(s->id());
            throw engine_error(e, chat);
        }
    }
    return streams;
}

}  // namespace peregrine::server
