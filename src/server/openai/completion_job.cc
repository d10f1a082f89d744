#include "server/openai/completion_job.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "server/api_error.h"
#include "server/openai/response_json.h"
#include "server/openai/tool_call_stream.h"

namespace peregrine::server {

namespace {

// One /v1/completions or /v1/chat/completions request, from submission to its last byte. Lives
// on the connection's strand (on_outputs arrives there through Exchange::post).
class CompletionJob : public std::enable_shared_from_this<CompletionJob> {
  public:
    CompletionJob(CompletionService& service, AdmittedCompletion admitted, std::string id, std::shared_ptr<Exchange> ex)
        : model_(*service.model()),
          service_(service),
          p_(std::move(admitted.params)),
          requests_(std::move(admitted.requests)),
          echo_texts_(std::move(admitted.echo_texts)),
          ticket_(std::move(admitted.ticket)),
          ex_(std::move(ex)),
          model_name_(p_.model.empty() ? service.model_name() : p_.model),
          chat_(p_.chat()),
          prompt_only_(!chat_ && p_.sampling.max_tokens == 0),
          defer_echo_(p_.stream && !chat_ && p_.echo && p_.sampling.prompt_logprobs >= 0),
          tool_setup_(chat_ ? tool_call_setup(p_, model_.tool_call_format) : std::nullopt),
          id_(std::move(id)),
          created_(unix_now()) {}

    // Submits every prompt; throws ApiError (nothing left running) when the engine refuses one.
    void start() {
        const int n = p_.sampling.n;
        choices_.resize(requests_.size() * n);
        // max_tokens 0 with echo: the prompt only, computed by the engine when its logprobs are
        // asked for (the one token drawn after it is left out).
        const bool generate = !prompt_only_ || p_.sampling.prompt_logprobs >= 0;
        prompt_lps_.resize(requests_.size());
        std::vector<std::shared_ptr<RequestStream>> streams;
        if (generate) streams = service_.submit(requests_, chat_);
        for (size_t i = 0; i < streams.size(); ++i) prompt_of_[streams[i]->id()] = static_cast<int>(i);
        if (!generate) {
            for (size_t i = 0; i < requests_.size(); ++i) {
                usage_.prompt_tokens += static_cast<int>(requests_[i].prompt_ids.size());
                for (int c = 0; c < n; ++c) choices_[i * n + c].finish = FinishReason::Length;
            }
        }
        if (tool_setup_)
            for (Choice& c : choices_) c.tools = std::make_unique<ChoiceToolCalls>(*tool_setup_);
        engine_ids_.reserve(streams.size());
        for (const auto& s : streams) engine_ids_.push_back(s->id());

        if (p_.stream) {
            ex_->start_events();
            // Echoed logprobs wait for the prompt's (with the choice's first output).
            if (!defer_echo_)
                for (size_t ci = 0; ci < choices_.size(); ++ci) begin_choice_events(static_cast<int>(ci));
        }
        auto self = shared_from_this();
        ex_->on_client_gone([self] { self->client_gone(); });
        ex_->on_cancel([self] { self->cancel(); });
        service_.pump().add(std::move(streams), [self](std::vector<RequestOutput>&& outs, bool done) {
            auto batch = std::make_shared<std::vector<RequestOutput>>(std::move(outs));
            self->ex_->post([self, batch, done] {
                try {
                    self->on_outputs(*batch, done);
                } catch (const std::exception& e) {
                    self->fail(e.what());
                }
            });
        });
    }

  private:
    struct Choice {
        std::string text;
        std::vector<TokenLogprob> logprobs;
        FinishReason finish = FinishReason::None;
        std::string stop_reason;
        int offset = 0;      // legacy logprobs: characters of text so far
        bool begun = false;  // its first events (begin_choice_events) went out
        // forced calls, or tool_choice auto with a served format: content and calls of the text
        std::unique_ptr<ChoiceToolCalls> tools;
    };

    // The calls as OpenAI writes them in a message.
    static Json tool_calls_json(const std::vector<ToolCall>& calls) {
        Json out = Json::array();
        for (const ToolCall& c : calls)
            out.push_back(
                {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        return out;
    }

    int prompt_index(const std::string& request_id) const {
        auto it = prompt_of_.find(request_id);
        return it == prompt_of_.end() ? 0 : it->second;
    }

    // A bug surfaced while answering: end the exchange cleanly rather than leave the client waiting.
    void fail(const char* what) {
        std::fprintf(stderr, "server: %s failed: %s\n", id_.c_str(), what);
        if (failed_) return;
        failed_ = true;
        for (const std::string& id : engine_ids_) model_.engine->abort(id);
        const ApiError e(500, "internal error while answering the request", "", "internal_error");
        if (p_.stream) {
            ex_->send_event(dump(e.body()));
            ex_->end_events();
        } else {
            ex_->respond(e.status(), dump(e.body()));
        }
    }

    void client_gone() {
        if (gone_) return;
        gone_ = true;
        for (const std::string& id : engine_ids_) model_.engine->abort(id);
    }

    // The client asked to stop but still listens: the answer ends with finish reason "abort".
    void cancel() {
        cancelled_ = true;
        for (const std::string& id : engine_ids_) model_.engine->abort(id);
    }

    void on_outputs(std::vector<RequestOutput>& outs, bool done) {
        if (failed_) {
            if (done) ticket_.release();
            return;
        }
        for (RequestOutput& out : outs) {
            const int pi = prompt_index(out.request_id);
            const int ci = pi * p_.sampling.n + out.index;
            if (ci < 0 || ci >= static_cast<int>(choices_.size())) continue;
            // Choice 0's first output carries the prompt's logprobs; the prompt's other choices
            // come after it (forked from it), so theirs find them here.
            if (!out.prompt_logprobs.empty()) prompt_lps_[pi] = std::move(out.prompt_logprobs);
            if (prompt_only_) leave_out_draw(out);
            if (defer_echo_ && !gone_ && !choices_[ci].begun) begin_choice_events(ci);
            if (out.usage && out.timing) service_.metrics().observe_request(out.finish, *out.usage, *out.timing);
            if (out.usage) {
                usage_.prompt_tokens += out.usage->prompt_tokens;
                usage_.completion_tokens += out.usage->completion_tokens;
                usage_.cached_tokens += out.usage->cached_tokens;
            }
            Choice& c = choices_[ci];
            if (out.finish != FinishReason::None) {
                c.finish = out.finish;
                c.stop_reason = out.stop_reason;
            }
            if (p_.stream && !gone_) {
                send_delta(ci, out);
            } else {
                c.text += out.text;
                if (p_.sampling.logprobs >= 0)
                    c.logprobs.insert(c.logprobs.end(), std::make_move_iterator(out.logprobs.begin()),
                                      std::make_move_iterator(out.logprobs.end()));
            }
        }
        if (!done) return;
        ticket_.release();
        ex_->note_usage(usage_.prompt_tokens, usage_.completion_tokens);
        if (gone_ || ex_->client_gone()) {
            ++service_.counters().requests_aborted;
            return;
        }
        ++(cancelled_ ? service_.counters().requests_aborted : service_.counters().requests_served);
        if (defer_echo_)  // (every choice has had an output, its last at least: none is left)
            for (size_t ci = 0; ci < choices_.size(); ++ci)
                if (!choices_[ci].begun) begin_choice_events(static_cast<int>(ci));
        if (p_.stream)
            finish_events();
        else
            send_whole();
    }

    // The token drawn after an echoed prompt only (max_tokens 0) is no part of the answer: the
    // choice ends there, for its length, having generated nothing.
    static void leave_out_draw(RequestOutput& out) {
        out.token_ids.clear();
        out.text.clear();
        out.logprobs.clear();
        if (out.usage) {
            out.usage->completion_tokens = 0;
            out.usage->max_choice_tokens = 0;
        }
        if (out.finish != FinishReason::None && out.finish != FinishReason::Abort) {
            out.finish = FinishReason::Length;
            out.stop_reason.clear();
        }
    }

    Json chunk_base() const {
        Json j;
        j["id"] = id_;
        j["object"] = chat_ ? "chat.completion.chunk" : "text_completion";
        j["created"] = created_;
        j["model"] = model_name_;
        return j;
    }

    Json finish_json(const Choice& c) const {
        return c.finish == FinishReason::None ? Json(nullptr) : Json(finish_reason_name(c.finish));
    }

    // The first events of a choice: the role (chat) or the echoed prompt (completions).
    void begin_choice_events(int ci) {
        choices_[ci].begun = true;
        Json chunk = chunk_base();
        Json choice;
        choice["index"] = ci;
        if (chat_) {
            choice["delta"] = {{"role", "assistant"}, {"content", ""}};
            choice["logprobs"] = nullptr;
            choice["finish_reason"] = nullptr;
        } else {
            if (!p_.echo && p_.sampling.max_tokens > 0) return;
            const int pi = ci / p_.sampling.n;
            Choice& c = choices_[ci];
            choice["text"] = p_.echo ? echo_texts_[pi] : "";
            if (p_.sampling.logprobs >= 0) {
                choice["logprobs"] =
                    completion_logprobs_json(*model_.tokenizer, p_.echo ? requests_[pi].prompt_ids : kNoIds,
                                             prompt_lps_[pi], {}, p_.sampling.logprobs, &c.offset);
            } else {
                choice["logprobs"] = nullptr;
            }
            choice["finish_reason"] = finish_json(c);
        }
        chunk["choices"] = Json::array({choice});
        if (p_.include_usage) chunk["usage"] = nullptr;
        ex_->send_event(dump(chunk));
    }

    // One chat.completion.chunk of choice `ci`.
    void send_chat_chunk(int ci, Json delta, Json logprobs = nullptr, Json finish = nullptr, Json stop = nullptr) {
        const bool last = !finish.is_null();  // the choice's last chunk also carries its stop_reason
        Json chunk = chunk_base();
        Json choice;
        choice["index"] = ci;
        choice["delta"] = std::move(delta);
        choice["logprobs"] = std::move(logprobs);
        choice["finish_reason"] = std::move(finish);
        if (last) choice["stop_reason"] = std::move(stop);
        chunk["choices"] = Json::array({std::move(choice)});
        if (p_.include_usage) chunk["usage"] = nullptr;
        ex_->send_event(dump(chunk));
    }

    // Tool calls: the text through the choice's parser. Content as usual; a call as OpenAI
    // streams it: its first delta has index, id, type and name (and the arguments so far), each
    // later one the index and the next piece of the arguments. The logprobs ride on the first.
    void send_parsed_delta(int ci, const RequestOutput& out, Json logprobs) {
        Choice& c = choices_[ci];
        const ToolCallDelta d = c.tools->feed(out.text, out.finish != FinishReason::None);
        if (d.pieces.empty() && !logprobs.is_null()) send_chat_chunk(ci, {{"content", ""}}, std::move(logprobs));
        for (const ToolCallPiece& p : d.pieces) {
            Json delta;
            if (p.call < 0) {
                delta = {{"content", p.text}};
            } else {
                Json tc = {{"index", p.call}};
                if (!p.name.empty()) {
                    tc["id"] = c.tools->id(p.call);
                    tc["type"] = "function";
                    tc["function"] = {{"name", p.name}, {"arguments", p.text}};
                } else {
                    tc["function"] = {{"arguments", p.text}};
                }
                delta = {{"tool_calls", Json::array({std::move(tc)})}};
            }
            send_chat_chunk(ci, std::move(delta), std::move(logprobs));
            logprobs = nullptr;
        }
    }

    void send_delta(int ci, const RequestOutput& out) {
        Choice& c = choices_[ci];
        const bool has_logprobs = p_.sampling.logprobs >= 0 && !out.logprobs.empty();
        const bool finished = out.finish != FinishReason::None;
        if (chat_) {
            Json logprobs =
                has_logprobs
                    ? Json{{"content", chat_logprobs_content(*model_.tokenizer, out.logprobs, p_.sampling.logprobs)},
                           {"refusal", nullptr}}
                    : Json(nullptr);
            if (c.tools) {
                send_parsed_delta(ci, out, std::move(logprobs));
            } else if (!out.text.empty() || has_logprobs) {
                send_chat_chunk(ci, {{"content", out.text}}, std::move(logprobs));
            }
            if (finished) {
                // An answer cut short (length, abort) says so even after complete calls.
                const bool called = c.tools && !c.tools->calls().empty() && c.finish == FinishReason::Stop;
                send_chat_chunk(ci, Json::object(), nullptr, called ? Json("tool_calls") : finish_json(c),
                                stop_reason_json(c.stop_reason, p_.sampling));
            }
            return;
        }
        if (out.text.empty() && !has_logprobs && !finished) return;
        Json chunk = chunk_base();
        Json choice;
        choice["index"] = ci;
        choice["text"] = out.text;
        choice["logprobs"] = has_logprobs ? completion_logprobs_json(*model_.tokenizer, {}, {}, out.logprobs,
                                                                     p_.sampling.logprobs, &c.offset)
                                          : Json(nullptr);
        choice["finish_reason"] = finished ? finish_json(c) : Json(nullptr);
        choice["stop_reason"] = finished ? stop_reason_json(c.stop_reason, p_.sampling) : Json(nullptr);
        chunk["choices"] = Json::array({choice});
        if (p_.include_usage) chunk["usage"] = nullptr;
        ex_->send_event(dump(chunk));
    }

    void finish_events() {
        if (p_.include_usage) {
            Json chunk = chunk_base();
            chunk["choices"] = Json::array();
            chunk["usage"] = usage_json(usage_);
            ex_->send_event(dump(chunk));
        }
        ex_->send_event("[DONE]");
        ex_->end_events();
    }

    void send_whole() {
        Json j;
        j["id"] = id_;
        j["object"] = chat_ ? "chat.completion" : "text_completion";
        j["created"] = created_;
        j["model"] = model_name_;
        Json choices = Json::array();
        for (size_t ci = 0; ci < choices_.size(); ++ci) {
            Choice& c = choices_[ci];
            const int pi = static_cast<int>(ci) / p_.sampling.n;
            Json choice;
            choice["index"] = ci;
            Json calls = nullptr;
            Json content = c.text;
            // Calls and the rest as content. Forced calls cut short are no calls here: the text is
            // the content (a stream has sent their pieces already).
            if (c.tools && (!tool_setup_->forced || c.finish == FinishReason::Stop)) {
                const ToolCallDelta d = c.tools->feed(c.text, true);
                if (!c.tools->calls().empty()) {
                    calls = tool_calls_json(c.tools->calls());
                    content = d.content;
                }
            }
            const bool called = !calls.is_null();
            if (chat_) {
                // `refusal`: required by OpenAI's schema of a message; a model here never refuses.
                choice["message"] = {{"role", "assistant"}, {"content", content}, {"refusal", nullptr}};
                if (called) {
                    if (content.get<std::string>().empty()) choice["message"]["content"] = nullptr;
                    choice["message"]["tool_calls"] = std::move(calls);
                }
                choice["logprobs"] =
                    p_.sampling.logprobs >= 0
                        ? Json{{"content", chat_logprobs_content(*model_.tokenizer, c.logprobs, p_.sampling.logprobs)},
                               {"refusal", nullptr}}
                        : Json(nullptr);
            } else {
                choice["text"] = p_.echo ? echo_texts_[pi] + c.text : c.text;
                if (p_.sampling.logprobs >= 0) {
                    choice["logprobs"] =
                        completion_logprobs_json(*model_.tokenizer, p_.echo ? requests_[pi].prompt_ids : kNoIds,
                                                 prompt_lps_[pi], c.logprobs, p_.sampling.logprobs, &c.offset);
                } else {
                    choice["logprobs"] = nullptr;
                }
                if (p_.prompt_logprobs >= 0)  // vLLM's field, per choice on /v1/completions
                    choice["prompt_logprobs"] = prompt_logprobs_json(*model_.tokenizer, requests_[pi].prompt_ids,
                                                                     prompt_lps_[pi], p_.prompt_logprobs);
            }
            // An answer cut short (length, abort) says so even after complete calls.
            choice["finish_reason"] = called && c.finish == FinishReason::Stop ? Json("tool_calls") : finish_json(c);
            choice["stop_reason"] = stop_reason_json(c.stop_reason, p_.sampling);
            choices.push_back(std::move(choice));
        }
        j["choices"] = std::move(choices);
        j["usage"] = usage_json(usage_);
        if (chat_ && p_.prompt_logprobs >= 0)  // vLLM's field, on the response for chat
            j["prompt_logprobs"] =
                prompt_logprobs_json(*model_.tokenizer, requests_[0].prompt_ids, prompt_lps_[0], p_.prompt_logprobs);
        ex_->respond(200, dump(j));
    }

    const ServedModel& model_;
    CompletionService& service_;
    const CompletionParams p_;
    const std::vector<Request> requests_;        // one per prompt (their prompt ids serve echo)
    const std::vector<std::string> echo_texts_;  // each prompt's text, for echo
    Ticket ticket_;
    std::shared_ptr<Exchange> ex_;
    const std::string model_name_;
    const bool chat_;
    const bool prompt_only_;                         // completions with max_tokens 0 (echo): no generated text
    const bool defer_echo_;                          // streamed echo with logprobs: sent with the choice's first output
    const std::optional<ToolCallSetup> tool_setup_;  // chat with tool calls to parse
    const std::string id_;
    const int64_t created_;
    std::unordered_map<std::string, int> prompt_of_;
    std::vector<std::string> engine_ids_;
    std::vector<Choice> choices_;
    std::vector<std::vector<TokenLogprob>> prompt_lps_;  // per prompt: RequestOutput::prompt_logprobs
    static inline const std::vector<int32_t> kNoIds;
    Usage usage_;
    bool gone_ = false;
    bool cancelled_ = false;
    bool failed_ = false;
};

}  // namespace

void start_completion(CompletionService& service, AdmittedCompletion admitted, std::string id,
                      std::shared_ptr<Exchange> ex) {
    std::make_shared<CompletionJob>(service, std::move(admitted), std::move(id), std::move(ex))->start();
}

}  // namespace peregrine::server
