#include "peregrine/engine.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "engine/engine_loop.h"
#include "engine/model_tokenizer.h"
#include "engine/output_processor.h"
#include "engine/pinned_prefix.h"
#include "engine/tokenizer_text.h"
#include "model/config_hf.h"
#include "model/loader.h"
#include "model/sentence_transformers.h"
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

namespace {

namespace fs = std::filesystem;

// The folder of a Hugging Face model's tokenizer files ("" for a GGUF, whose vocabulary is inside).
std::string hf_model_dir(const std::string& model) {
    std::error_code ec;
    if (fs::is_directory(model, ec)) return model;
    if (fs::path(model).extension() == ".safetensors") return fs::path(model).parent_path().string();
    return {};
}

// The tokenizer, read before the weights: it is quick, and a missing one must not wait for a
// slow load (dummy weights of a large shape took 20 s before "no tokenizer.json"). Null: the
// model is a GGUF, its vocabulary read once the file is open.
std::shared_ptr<const Tokenizer> early_tokenizer(const EngineConfig& c) {
    if (!c.tokenizer.empty()) {
        try {
            return std::make_shared<const Tokenizer>(Tokenizer::load(c.tokenizer));
        } catch (const Error& e) {
            fail("--tokenizer: ", e.what());
        }
    }
    const std::string model = c.model.empty() ? default_model_path() : c.model;
    const std::string dir = hf_model_dir(model);
    if (dir.empty()) return nullptr;
    std::error_code ec;
    if (!fs::exists(fs::path(dir) / "config.json", ec)) return nullptr;  // the loader says what is wrong
    try {
        return std::make_shared<const Tokenizer>(Tokenizer::load(dir));
    } catch (const Error& e) {
        fail(e.what(), "; pass --tokenizer PATH (a folder with tokenizer.json, a tokenizer.json or a GGUF)");
    }
}

// EngineConfig::generation_config: the defaults requests get for the sampling fields they leave out.
GenerationDefaults generation_defaults(const EngineConfig& c, const ModelConfig::GenerationDefaults& model) {
    ModelConfig::GenerationDefaults d;
    if (c.generation_config == "auto") {
        d = model;
    } else if (c.generation_config != "vllm") {
        const fs::path file = fs::path(c.generation_config) / "generation_config.json";
        std::error_code ec;
        if (!fs::exists(file, ec))
            fail("--generation-config ", c.generation_config,
                 ": no generation_config.json there (use auto, vllm or a folder holding one)");
        d = read_generation_defaults(file.string());
    }
    return {d.temperature, d.top_p, d.min_p, d.repetition_penalty, d.top_k};
}

}  // namespace

std::unique_ptr<Engine> Engine::create(const EngineConfig& config) {
    config.validate();
    std::shared_ptr<const Tokenizer> tokenizer = early_tokenizer(config);
    BuiltExecutor built = create_executor(config);
    const LoadedModel& loaded = built.worker->loaded();
    ModelInfo info;
    info.path = loaded.path;
    info.format = loaded.format;
    info.vocab_size = loaded.config.vocab_size;
    info.max_model_len = built.executor->max_model_len();
    info.eos_token_ids = loaded.config.eos_token_ids;
    info.generation_defaults = generation_defaults(config, loaded.config.generation_defaults);
    info.model_dir = loaded.model_dir;
    info.gguf = loaded.gguf;
    info.hidden_size = loaded.config.hidden_size;
    if (config.task == "embed") {
        info.pooling = resolve_pooling(config, info.model_dir, loaded.config.arch, &info.pooling_source);
        std::fprintf(stderr, "  task embed: %s pooling (%s), %s, %d dimensions\n",
                     pooling_type_name(info.pooling->type), info.pooling_source.c_str(),
                     info.pooling->normalize ? "normalised" : "not normalised", info.hidden_size);
    }
    if (!tokenizer) tokenizer = model_tokenizer(config, loaded);
    // Another model's tokenizer must not name tokens this model cannot produce or read.
    if (!config.tokenizer.empty() && tokenizer->size() > info.vocab_size)
        fail("--tokenizer ", config.tokenizer, " has ", tokenizer->size(),
             " tokens, more than the model's vocabulary of ", info.vocab_size);
    std::fprintf(stderr, "  max_model_len: %d tokens; sampling defaults (%s): %s\n", info.max_model_len,
                 config.generation_config == "auto" ? "generation_config.json" : config.generation_config.c_str(),
                 describe(info.generation_defaults).c_str());
    CoreConfig core = core_config(built.worker->config(), info.eos_token_ids);
    core.pinned_prefixes = pinned_prefix_tokens(config.pin_prefix, config, info, *tokenizer);
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
