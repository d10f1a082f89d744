// POST /v1/embeddings: the inputs tokenized and checked here, each run through the engine as an
// embedding Request (prefill and pooling only, batched with whatever else runs), the vectors
// gathered as the stream pump delivers them and answered in one OpenAI list.
#include <cstdio>
#include <memory>
#include <unordered_map>

#include "core/error.h"
#include "server/api_error.h"
#include "server/openai/embedding_request.h"
#include "server/openai/handlers.h"
#include "server/openai/response_json.h"

namespace peregrine::server {

namespace {

// One request's inputs in the engine, on the exchange's strand from the pump's first delivery on.
class EmbeddingJob : public std::enable_shared_from_this<EmbeddingJob> {
  public:
    EmbeddingJob(CompletionService& service, std::shared_ptr<Exchange> ex, std::string model_name, bool base64,
                 Ticket ticket, std::vector<std::string> ids)
        : service_(service),
          ex_(std::move(ex)),
          model_name_(std::move(model_name)),
          base64_(base64),
          ticket_(std::move(ticket)),
          ids_(std::move(ids)),
          vectors_(ids_.size()) {
        for (size_t i = 0; i < ids_.size(); ++i) index_of_[ids_[i]] = i;
    }

    void start(std::vector<std::shared_ptr<RequestStream>> streams) {
        auto self = shared_from_this();
        ex_->on_client_gone([self] { self->abort(); });
        ex_->on_cancel([self] { self->abort(); });
        service_.pump().add(std::move(streams), [self](std::vector<RequestOutput>&& outs, bool done) {
            auto batch = std::make_shared<std::vector<RequestOutput>>(std::move(outs));
            self->ex_->post([self, batch, done] { self->on_outputs(*batch, done); });
        });
    }

  private:
    void abort() {
        if (aborted_) return;
        aborted_ = true;
        for (const std::string& id : ids_) service_.model()->engine->abort(id);
    }

    void on_outputs(std::vector<RequestOutput>& outs, bool done) {
        for (RequestOutput& out : outs) {
            const auto it = index_of_.find(out.request_id);
            if (it == index_of_.end()) continue;
            if (out.usage && out.timing) service_.metrics().observe_request(out.finish, *out.usage, *out.timing);
            if (out.usage) prompt_tokens_ += out.usage->prompt_tokens;
            if (out.finish == FinishReason::Stop && !out.embedding.empty()) {
                vectors_[it->second] = std::move(out.embedding);
                ++received_;
            }
        }
        if (!done) return;
        ticket_.release();
        ex_->note_usage(prompt_tokens_, 0);
        if (aborted_ || ex_->client_gone()) {
            ++service_.counters().requests_aborted;
            if (!ex_->client_gone()) respond_error(ApiError(499, "the request was cancelled", "", "cancelled"));
            return;
        }
        if (received_ != vectors_.size()) {  // the engine ended them early: it is shutting down
            ++service_.counters().requests_aborted;
            respond_error(ApiError(503, "the server is shutting down", "", "shutting_down"));
            return;
        }
        ++service_.counters().requests_served;
        ex_->respond(200, dump(embeddings_json(vectors_, base64_, model_name_, prompt_tokens_)));
    }

    void respond_error(const ApiError& e) { ex_->respond(e.status(), dump(e.body())); }

    CompletionService& service_;
    std::shared_ptr<Exchange> ex_;
    const std::string model_name_;
    const bool base64_;
    Ticket ticket_;
    const std::vector<std::string> ids_;  // the engine requests, input order
    std::unordered_map<std::string, size_t> index_of_;
    std::vector<std::vector<float>> vectors_;
    size_t received_ = 0;
    int prompt_tokens_ = 0;
    bool aborted_ = false;
};

}  // namespace

void handle_embeddings(CompletionService& service, ApiCall& call) {
    const ServedModel& m = *service.model();
    if (!m.pooling)
        throw ApiError(400,
                       str_cat("The model '", service.model_name(),
                               "' does not support embeddings: this server generates text. Start an embedding "
                               "server with `peregrine serve MODEL --task embed`"),
                       "model", "model_does_not_support_embeddings");
    EmbeddingParams p = parse_embedding_params(call.body);
    service.check_model(p.model);
    if (p.dimensions > m.hidden_size)
        bad_param("dimensions", "'dimensions' must be at most the model's embedding size ", m.hidden_size, ", got ",
                  p.dimensions);
    RequestCost cost;
    std::vector<std::vector<int32_t>> prompts;
    for (const PromptInput& in : p.inputs) {
        std::vector<int32_t> ids = in.is_text ? service.encode_prompt(in.text, p.add_special_tokens, "input") : in.ids;
        for (int32_t t : ids)
            if (!m.tokenizer->valid_id(t))
                bad_param("input", "input token id ", t, " is outside the vocabulary (0..", m.vocab_size - 1, ")");
        if (ids.empty()) bad_param("input", "an input has no tokens");
        if (static_cast<int>(ids.size()) > m.max_model_len)  // vLLM's wording
            throw ApiError(400,
                           str_cat("This model's maximum context length is ", m.max_model_len,
                                   " tokens. However, you requested ", ids.size(),
                                   " tokens in the input for embedding generation. Please reduce the length of "
                                   "the input."),
                           "input", "context_length_exceeded");
        cost.sequences += 1;
        cost.tokens += static_cast<int64_t>(ids.size());
        prompts.push_back(std::move(ids));
    }
    Ticket ticket = service.admit_inputs(call.caller, p.inputs.size(), cost);
    const std::string id = str_cat("embd-", random_hex_id());
    std::vector<Request> requests(prompts.size());
    std::vector<std::string> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
        Request& r = requests[i];
        r.id = prompts.size() == 1 ? id : str_cat(id, "-", i);
        r.prompt_ids = std::move(prompts[i]);
        r.pooling = m.pooling;
        r.pooling->dimensions = p.dimensions;
        r.priority = p.priority;
        r.group = id;  // the inputs of one call share one fair share of the running slots
        ids.push_back(r.id);
    }
    std::vector<std::shared_ptr<RequestStream>> streams;
    try {
        streams = service.submit(requests, false);
    } catch (const ApiError& e) {
        throw ApiError(e.status(), e.what(), e.param() == "prompt" ? "input" : e.param(), e.code());
    }
    auto job = std::make_shared<EmbeddingJob>(service, call.ex, p.model.empty() ? service.model_name() : p.model,
                                              p.base64, std::move(ticket), std::move(ids));
    job->start(std::move(streams));
}

}  // namespace peregrine::server
