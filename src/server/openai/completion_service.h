// The serving core every transport shares (REST, WebSocket, gRPC): the loaded model, the
// admission gate, the stream pump and the counters; and the one path from a typed request
// (CompletionParams) to admitted engine Requests (admit) and into the engine (submit).
//
//   JSON body (REST, WebSocket) --parse_completion_params----------+
//                                                                  +--> CompletionParams
//   GenerateRequest --completion_params_from_proto (grpc/)--------+       --admit--> AdmittedCompletion
//                                                                           --submit--> RequestStreams
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "peregrine/engine.h"
#include "server/admission.h"
#include "server/metrics.h"
#include "server/openai/completion_request.h"
#include "server/openai/server_options.h"
#include "server/served_model.h"
#include "server/stream_pump.h"
#include "template/jinja.h"

namespace peregrine::server {

// Seconds since the Unix epoch (OpenAI's `created`).
int64_t unix_now();

// A completion request checked and admitted, ready for the engine.
struct AdmittedCompletion {
    CompletionParams params;
    // One per prompt: id `id` (several prompts: `id`-0, `id`-1, ...), all in group `id` (one
    // fair share of the running slots), the request's sampling, priority and cache salt.
    std::vector<Request> requests;
    std::vector<std::string> echo_texts;  // completions: each prompt's text, for echo
    Ticket ticket;                        // its share of the in-flight limits, until it ends
};

class CompletionService {
  public:
    struct Counters {
        std::atomic<uint64_t> requests_served{0};   // completions answered in full
        std::atomic<uint64_t> requests_aborted{0};  // ended by a client that went away or cancelled
    };

    explicit CompletionService(OpenAiServerOptions options);
    ~CompletionService();  // shutdown()
    CompletionService(const CompletionService&) = delete;
    CompletionService& operator=(const CompletionService&) = delete;

    // The model is loaded: start answering (until then check_caller answers 503).
    void set_model(std::unique_ptr<ServedModel> model);
    // Graceful shutdown: new requests get 503; running ones go on.
    void begin_drain() { draining_.store(true, std::memory_order_release); }
    // Ends every running request now (finish reason "abort"); their answers still go out.
    void abort_all();
    // Aborts what is running, stops the engine and the pump.
    void shutdown();

    // Null until set_model.
    const ServedModel* model() const { return ready() ? model_.get() : nullptr; }
    bool ready() const { return ready_.load(std::memory_order_acquire); }
    bool draining() const { return draining_.load(std::memory_order_acquire); }
    const OpenAiServerOptions& options() const { return options_; }
    const std::string& model_name() const { return options_.model_names.front(); }
    // Completion requests being answered (every transport).
    int64_t in_flight() const { return admission_.requests_in_flight(); }
    double uptime_s() const;
    int64_t created_unix() const { return created_unix_; }
    Counters& counters() { return counters_; }
    ServerMetrics& metrics() { return metrics_; }
    StreamPump& pump() { return pump_; }

    // The admission gate. check_caller: 401 (key) / 503 (loading, draining).
    void check_caller(const Caller& caller) const;
    // Requests that hold nothing in flight (tokenize, models): the caller's request rate.
    void charge(const Caller& caller) { admission_.charge(caller); }
    // ApiError(404) for a name this server does not serve (empty: the default).
    void check_model(const std::string& name) const;
    // What validate() checks a request's sampling against here (the engine adds max_num_seqs).
    SamplingLimits sampling_limits() const;
    // Where a request's sampling fields start: the model's recommended defaults (ServedModel).
    SamplingParams request_defaults() const { return ready() ? model_->request_defaults : SamplingParams{}; }

    // Chat messages through the model's template into prompt ids; throws ApiError(400).
    std::vector<int32_t> render_chat(const CompletionParams& p) const;
    // A prompt's text into ids; 400 naming `param` without tokenizing when it is surely over the context.
    std::vector<int32_t> encode_prompt(const std::string& text, bool add_special, const char* param) const;

    // 400 on an embedding server (serve --task embed): it answers /v1/embeddings only.
    void check_generates() const;
    // The admission gate of an embeddings request: `num_inputs` inputs (--max-prompts) costing
    // `cost` in flight, charged to the caller's rate limits. Throws ApiError (400 naming "input").
    Ticket admit_inputs(const Caller& caller, size_t num_inputs, const RequestCost& cost) const;

    // The one request builder: the model name checked, the prompts tokenized (chat: rendered),
    // the context and per-request limits checked, room in flight reserved and the caller's rate
    // limits charged; the engine Requests built with ids from `id`. Throws ApiError.
    AdmittedCompletion admit(const Caller& caller, CompletionParams params, const std::string& id) const;
    // Engine::submit for each request; on a refusal the ones already submitted are aborted and
    // it throws ApiError (400 naming the field; 503 when shutting down).
    std::vector<std::shared_ptr<RequestStream>> submit(const std::vector<Request>& requests, bool chat) const;

  private:
    OpenAiServerOptions options_;
    std::atomic<bool> ready_{false};
    std::atomic<bool> draining_{false};
    mutable Admission admission_;
    ServerMetrics metrics_;
    std::unique_ptr<ServedModel> model_;
    jinja::Context template_functions_;  // strftime_now
    StreamPump pump_;
    Counters counters_;
    const std::chrono::steady_clock::time_point started_;
    const int64_t created_unix_;
};

}  // namespace peregrine::server
