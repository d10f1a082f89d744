#include "server/openai/responses_exchange.h"

#include "server/openai/completion_service.h"
#include "server/openai/response_json.h"

namespace peregrine::server {

namespace {

// Chat usage as the Responses API counts it.
Json responses_usage(const Json& u) {
    const Json cached = u.contains("prompt_tokens_details") ? u["prompt_tokens_details"].value("cached_tokens", 0) : 0;
    return {{"input_tokens", u.value("prompt_tokens", 0)},
            {"input_tokens_details", {{"cached_tokens", cached}, {"cache_write_tokens", 0}}},
            {"output_tokens", u.value("completion_tokens", 0)},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", u.value("total_tokens", 0)}};
}

Json text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
}

Json message_item(const std::string& id, const char* status, Json content) {
    return {
        {"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

Json call_item(const std::string& id, const char* status, const Json& call_id, const Json& name, std::string args) {
    return {{"id", id},     {"type", "function_call"},     {"status", status}, {"call_id", call_id},
            {"name", name}, {"arguments", std::move(args)}};
}

class ResponsesExchange final : public Exchange {
  public:
    ResponsesExchange(std::shared_ptr<Exchange> inner, std::string id, std::string model, Json echoed)
        : inner_(std::move(inner)),
          id_(std::move(id)),
          model_(std::move(model)),
          echoed_(std::move(echoed)),
          created_(unix_now()) {}

    void post(std::function<void()> fn) override { inner_->post(std::move(fn)); }
    boost::asio::any_io_executor executor() const override { return inner_->executor(); }
    void on_client_gone(std::function<void()> fn) override { inner_->on_client_gone(std::move(fn)); }
    bool client_gone() const override { return inner_->client_gone(); }
    void note_usage(int prompt, int completion) override { inner_->note_usage(prompt, completion); }
    void on_cancel(std::function<void()> fn) override { inner_->on_cancel(std::move(fn)); }
    void accept_websocket(WebSocketSetup setup) override { inner_->accept_websocket(std::move(setup)); }

    void respond(int status, std::string body, std::string content_type, const HeaderList& extra) override {
        if (status != 200) return inner_->respond(status, std::move(body), std::move(content_type), extra);
        const Json chat = Json::parse(body, nullptr, false);
        const Json& choice = chat.at("choices").at(0);
        const Json& message = choice.at("message");
        finish_ = choice.value("finish_reason", "");
        const bool cut = finish_ == "length";
        const Json& calls = message.contains("tool_calls") ? message["tool_calls"] : Json::array();
        const std::string text = message["content"].is_string() ? message["content"].get<std::string>() : "";
        if (!text.empty() || calls.empty())
            output_.push_back(
                message_item(item_id("msg_"), cut ? "incomplete" : "completed", Json::array({text_part(text)})));
        for (const Json& c : calls)
            output_.push_back(call_item(item_id("fc_"), "completed", c["id"], c["function"]["name"],
                                        c["function"]["arguments"].get<std::string>()));
        usage_ = responses_usage(chat.at("usage"));
        inner_->respond(200, dump(response_json()), std::move(content_type), extra);
    }

    void start_events(const HeaderList& extra) override {
        inner_->start_events(extra);
        emit("response.created", {{"response", response_json()}});
        emit("response.in_progress", {{"response", response_json()}});
    }

    void send_event(std::string_view data) override {
        if (data == "[DONE]" || failed_) return;
        const Json chunk = Json::parse(data, nullptr, false);
        if (chunk.contains("error")) {  // the job failed: OpenAI's error body
            const Json& e = chunk["error"];
            emit("error", {{"code", e.value("code", Json(nullptr))},
                           {"message", e.value("message", "")},
                           {"param", e.value("param", Json(nullptr))}});
            failed_ = true;
            return;
        }
        if (chunk.contains("usage") && chunk["usage"].is_object()) usage_ = responses_usage(chunk["usage"]);
        if (!chunk.contains("choices") || chunk["choices"].empty()) return;
        const Json& choice = chunk["choices"][0];
        if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
            finish_ = choice["finish_reason"].get<std::string>();
        const Json& delta = choice.value("delta", Json::object());
        if (auto c = delta.find("content"); c != delta.end() && c->is_string() && !c->get<std::string>().empty())
            text_delta(c->get<std::string>());
        if (auto calls = delta.find("tool_calls"); calls != delta.end())
            for (const Json& call : *calls) call_delta(call);
    }

    void end_events() override {
        if (!failed_) {
            close_open();
            if (output_.empty()) {  // an empty answer is still one message
                open_message();
                close_open();
            }
            const Json response = response_json();
            emit(response["status"] == "completed" ? "response.completed" : "response.incomplete",
                 {{"response", response}});
        }
        inner_->end_events();
    }

  private:
    enum class Open { None, Message, Call };

    std::string item_id(const char* prefix) const { return prefix + random_hex_id(); }

    const char* status() const {
        if (finish_ == "length") return "incomplete";
        if (finish_ == "abort") return "cancelled";
        return finish_.empty() ? "in_progress" : "completed";
    }

    Json response_json() const {
        Json r;
        r["id"] = id_;
        r["object"] = "response";
        r["created_at"] = created_;
        r["status"] = status();
        r["completed_at"] = finish_.empty() || finish_ == "length" ? Json(nullptr) : Json(unix_now());
        r["error"] = nullptr;
        r["incomplete_details"] = finish_ == "length" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
        r["instructions"] = echoed_["instructions"];
        r["max_output_tokens"] = echoed_["max_output_tokens"];
        r["model"] = model_;
        r["output"] = output_;
        for (const auto& [key, v] : echoed_.items())
            if (!r.contains(key)) r[key] = v;
        if (!usage_.is_null()) r["usage"] = usage_;  // known at the end (OpenAI's schema: an object or absent)
        return r;
    }

    void emit(const char* type, Json fields) {
        Json e;
        e["type"] = type;
        for (auto& [key, v] : fields.items()) e[key] = std::move(v);
        e["sequence_number"] = seq_++;
        inner_->send_event(dump(e));
    }

    int open_index() const { return static_cast<int>(output_.size()) - 1; }

    void open_message() {
        output_.push_back(message_item(item_id("msg_"), "in_progress", Json::array()));
        open_ = Open::Message;
        text_.clear();
        const Json& item = output_.back();
        emit("response.output_item.added", {{"output_index", open_index()}, {"item", item}});
        emit("response.content_part.added",
             {{"item_id", item["id"]}, {"output_index", open_index()}, {"content_index", 0}, {"part", text_part("")}});
    }

    void text_delta(const std::string& text) {
        if (open_ != Open::Message) {
            close_open();
            open_message();
        }
        text_ += text;
        emit("response.output_text.delta", {{"item_id", output_.back()["id"]},
                                            {"output_index", open_index()},
                                            {"content_index", 0},
                                            {"delta", text},
                                            {"logprobs", Json::array()}});
    }

    void call_delta(const Json& call) {
        const Json& fn = call.value("function", Json::object());
        if (call.contains("id")) {  // a new call: its id and name first
            close_open();
            output_.push_back(call_item(item_id("fc_"), "in_progress", call["id"], fn.value("name", ""), ""));
            open_ = Open::Call;
            text_.clear();
            emit("response.output_item.added", {{"output_index", open_index()}, {"item", output_.back()}});
        }
        const std::string args = fn.value("arguments", "");
        if (open_ != Open::Call || args.empty()) return;
        text_ += args;
        emit("response.function_call_arguments.delta",
             {{"item_id", output_.back()["id"]}, {"output_index", open_index()}, {"delta", args}});
    }

    // Ends the item being streamed: its done events, then output_item.done with the whole item.
    void close_open() {
        if (open_ == Open::None) return;
        Json& item = output_.back();
        if (open_ == Open::Message) {
            const Json base = {{"item_id", item["id"]}, {"output_index", open_index()}, {"content_index", 0}};
            Json done = base;
            done["text"] = text_;
            done["logprobs"] = Json::array();
            emit("response.output_text.done", std::move(done));
            Json part = base;
            part["part"] = text_part(text_);
            emit("response.content_part.done", std::move(part));
            item["content"] = Json::array({text_part(text_)});
            item["status"] = finish_ == "length" ? "incomplete" : "completed";
        } else {
            emit("response.function_call_arguments.done", {{"item_id", item["id"]},
                                                           {"name", item["name"]},
                                                           {"output_index", open_index()},
                                                           {"arguments", text_}});
            item["arguments"] = text_;
            item["status"] = "completed";
        }
        emit("response.output_item.done", {{"output_index", open_index()}, {"item", item}});
        open_ = Open::None;
    }

    std::shared_ptr<Exchange> inner_;
    const std::string id_;
    const std::string model_;
    const Json echoed_;
    const int64_t created_;
    Json output_ = Json::array();
    Json usage_ = nullptr;
    std::string finish_;  // the chat finish_reason once known
    Open open_ = Open::None;
    std::string text_;  // the open item's text or arguments so far
    int seq_ = 0;
    bool failed_ = false;
};

}  // namespace

std::shared_ptr<Exchange> make_responses_exchange(std::shared_ptr<Exchange> inner, std::string id, std::string model,
                                                  Json echoed) {
    return std::make_shared<ResponsesExchange>(std::move(inner), std::move(id), std::move(model), std::move(echoed));
}

}  // namespace peregrine::server
