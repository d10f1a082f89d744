// The engine as a library: build it from an EngineConfig, submit requests from any thread,
// read each request's outputs from its stream. A thread inside runs schedule -> run -> sample
// -> emit. examples/embed.cc is a whole program using only this header.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "peregrine/engine_config.h"
#include "peregrine/engine_types.h"

namespace peregrine {

class EngineLoop;
class GgufFile;
class RequestText;
class Tokenizer;

// The outputs of one request, in order. Filled by the engine thread, read by one consumer,
// on whose thread next() also turns the outputs' tokens into text (detokenization and stop
// strings run there, not on the engine thread).
class RequestStream {
  public:
    explicit RequestStream(std::string id);
    ~RequestStream();
    const std::string& id() const { return id_; }

    // Blocks until the next output; false once the request has ended and all was read.
    bool next(RequestOutput& out);
    // As next(), giving up after `timeout` (then returns false with *timed_out = true).
    bool next_for(RequestOutput& out, std::chrono::milliseconds timeout, bool* timed_out);

  private:
    friend class EngineLoop;
    void push(RequestOutput out, bool last);
    // Text for a popped output; false when it is to be skipped (see RequestText::process).
    bool finish(RequestOutput& out);

    std::string id_;
    std::unique_ptr<RequestText> text_;     // null: token ids only
    std::function<void(int)> stop_choice_;  // asks the engine to end choice i (a stop string)
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<RequestOutput> queue_;
    bool closed_ = false;
};

// Sampling defaults the model's authors recommend (generation_config.json); unset when absent.
struct GenerationDefaults {
    std::optional<float> temperature, top_p, min_p, repetition_penalty;
    std::optional<int> top_k;
};

// Sets the fields of `p` that `d` recommends, leaving the others: what a front end does before it
// applies what the request (or a flag) gave. A negative top_k means no limit (0).
void apply_generation_defaults(const GenerationDefaults& d, SamplingParams& p);
// "temperature=0.6 top_p=0.95 top_k=20" for the load log; "none" when nothing is set.
std::string describe(const GenerationDefaults& d);

// What the loaded model is, for front ends (limits, tokenizer and chat-template sources).
struct ModelInfo {
    std::string path;    // as given, or the embedded model's folder
    std::string format;  // "safetensors" | "gguf"
    int vocab_size = 0;
    int max_model_len = 0;  // tokens of one sequence at most: the context, or less (EngineConfig::max_model_len)
    std::vector<int> eos_token_ids;
    GenerationDefaults generation_defaults;  // as EngineConfig::generation_config chose
    std::string model_dir;                   // folder of tokenizer files and chat template (HF); empty for GGUF
    std::shared_ptr<GgufFile> gguf;          // the open GGUF file (tokenizer and template inside); null for HF
    int hidden_size = 0;                     // an embedding's values at most
    // EngineConfig::task embed: the pooling of embedding requests, as resolved at load (dimensions
    // 0); unset for a generating engine.
    std::optional<PoolingParams> pooling;
    std::string pooling_source;  // where `pooling` came from: "flags", "modules.json", "default"
};

class Engine {
  public:
    // Loads the model onto the configured device, sizes the KV cache and warms up; logs what
    // it chose to stderr. Throws Error with a message naming the bad value or file.
    static std::unique_ptr<Engine> create(const EngineConfig& config);
    explicit Engine(std::unique_ptr<EngineLoop> loop);  // the project's tests build the loop themselves
    ~Engine();                                          // shutdown()
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Checks the request on the caller's thread (throws Error with a client-facing message)
    // and queues it; the engine picks it up before its next step.
    std::shared_ptr<RequestStream> submit(Request request);
    // Ends the request within one step (finish reason "abort"); its blocks are freed.
    void abort(const std::string& id);
    // A snapshot taken after the latest step.
    EngineStats stats() const;
    // Stops the loop; requests still running end with "abort".
    void shutdown();

    const ModelInfo& model() const;
    // `text` as a user's prompt: the tokenizer's BOS/EOS rules, special-token text not parsed.
    std::vector<int32_t> tokenize(const std::string& text) const;
    // The model's tokenizer; null when the engine was built without one.
    std::shared_ptr<const Tokenizer> tokenizer() const;

  private:
    std::unique_ptr<EngineLoop> loop_;
};

}  // namespace peregrine
