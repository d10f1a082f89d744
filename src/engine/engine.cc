#include "peregrine/engine.h"

#include "core/error.h"
#include "engine/engine_loop.h"
#include "engine/output_processor.h"
#include "engine/tokenizer_text.h"
#include "tokenizer/tokenizer.h"
#include "worker/parallel_executor.h"

namespace peregrine {

RequestStream::RequestStream(std::string id) : id_(std::move(id)) {}

RequestStream::~RequestStream() = default;

bool RequestStream::finish(RequestOutput& out) {
    if (!text_) return true;
    int stopped = -1;
    const bool keep = text_->process(out, &stopped);
    if (stopped >= 0 && stop_choice_) stop_choice_(stopped);
    return keep;
}

bool RequestStream::next(RequestOutput& out) {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
            if (queue_.empty()) return false;
            out = std::move(queue_.front());
            queue_.pop_front();
        }
        if (finish(out)) return true;
    }
}

bool RequestStream::next_for(RequestOutput& out, std::chrono::milliseconds timeout, bool* timed_out) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            *timed_out = !cv_.wait_until(lock, deadline, [&] { return !queue_.empty() || closed_; });
            if (*timed_out || queue_.empty()) return false;
            out = std::move(queue_.front());
            queue_.pop_front();
        }
        if (finish(out)) return true;
    }
}

void RequestStream::push(RequestOutput out, bool last) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(out));
        closed_ = closed_ || last;
    }
    cv_.notify_all();
}

std::unique_ptr<Engine> Engine::create(const EngineConfig& config) {
    BuiltExecutor built = create_executor(config);
    const LoadedModel& loaded = built.worker->loaded();
    ModelInfo info;
    info.path = loaded.path;
    info.format = loaded.format;
    info.vocab_size = loaded.config.vocab_size;
    info.max_model_len = loaded.config.max_position_embeddings;
    info.eos_token_ids = loaded.config.eos_token_ids;
    const auto& d = loaded.config.generation_defaults;
    info.generation_defaults = {d.temperature, d.top_p, d.min_p, d.repetition_penalty, d.top_k};
    info.model_dir = loaded.model_dir;
    info.gguf = loaded.gguf;
    auto tokenizer = std::make_shared<const Tokenizer>(loaded.gguf ? Tokenizer::from_gguf(*loaded.gguf)
                                                                   : Tokenizer::load(loaded.model_dir));
    const CoreConfig core = core_config(built.worker->config(), info.eos_token_ids);
    return std::make_unique<Engine>(std::make_unique<EngineLoop>(
        core, std::move(built.executor), std::make_shared<TokenizerText>(tokenizer), std::move(info), tokenizer));
}

Engine::Engine(std::unique_ptr<EngineLoop> loop) : loop_(std::move(loop)) {}

Engine::~Engine() = default;

std::shared_ptr<RequestStream> Engine::submit(Request request) {
    return loop_->submit(std::move(request));
}

void Engine::abort(const std::string& id) {
    loop_->abort(id);
}

EngineStats Engine::stats() const {
    return loop_->stats();
}

void Engine::shutdown() {
    loop_->shutdown();
}

const ModelInfo& Engine::model() const {
    return loop_->model();
}

std::vector<int32_t> Engine::tokenize(const std::string& text) const {
    if (!loop_->tokenizer()) fail("this engine has no tokenizer");
    return loop_->tokenizer()->encode(text, /*add_special_tokens=*/true, /*parse_special=*/false);
}

std::shared_ptr<const Tokenizer> Engine::tokenizer() const {
    return loop_->tokenizer();
}

}  // namespace peregrine
