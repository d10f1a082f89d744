// The thread behind the public Engine: takes submitted requests, aborts and stop-string ends
// between steps, drives the EngineCore and hands each output to its request's stream. Text
// (detokenization, stop strings) is made by each stream's consumer, not here
// (output_processor.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine_core.h"
#include "engine/structured_output.h"
#include "engine/text_output.h"
#include "peregrine/engine.h"

namespace peregrine {

// What other threads hand the engine thread, under one mutex. Streams keep a weak reference
// to end a choice on a stop string.
struct EngineInbox {
    std::mutex mu;
    std::condition_variable cv;
    struct Incoming {
        Request request;
        std::shared_ptr<RequestStream> stream;
        std::shared_ptr<const grammar::TokenizedGrammar> grammar;  // structured output, compiled
        // When submit() took it: the engine thread may be inside a step for a while before it
        // looks at the inbox, and that wait is queue time too.
        std::chrono::steady_clock::time_point submitted;
    };
    std::vector<Incoming> incoming;
    std::vector<std::string> aborts;
    std::vector<std::pair<std::string, int>> stops;  // (request id, choice index) a stop string ended
    std::unordered_map<std::string, std::shared_ptr<RequestStream>> live;  // id -> stream, submit to end
    EngineStats stats;
    bool stop = false;
};

class EngineLoop {
  public:
    // `text` may be null (token ids only; stop strings refused); `model` and `tokenizer` are
    // what Engine reports.
    EngineLoop(const CoreConfig& config, std::unique_ptr<ModelExecutor> executor,
               std::shared_ptr<const TextProcessor> text, ModelInfo model = {},
               std::shared_ptr<const Tokenizer> tokenizer = nullptr);
    ~EngineLoop();
    EngineLoop(const EngineLoop&) = delete;
    EngineLoop& operator=(const EngineLoop&) = delete;

    std::shared_ptr<RequestStream> submit(Request request);
    void abort(const std::string& id);
    EngineStats stats() const;
    void shutdown();
    const ModelInfo& model() const { return model_; }
    const std::shared_ptr<const Tokenizer>& tokenizer() const { return tokenizer_; }

  private:
    void loop();

    ModelInfo model_;
    std::shared_ptr<const Tokenizer> tokenizer_;
    std::shared_ptr<const TextProcessor> text_;
    std::unique_ptr<ModelExecutor> executor_;
    EngineCore core_;                         // engine thread only
    std::unique_ptr<GrammarCache> grammars_;  // with a tokenizer; used by submitting threads
    std::shared_ptr<EngineInbox> inbox_;
    std::thread thread_;
};

// The core settings an EngineConfig asks for, with the model's end tokens.
CoreConfig core_config(const EngineConfig& config, const std::vector<int>& eos_token_ids);

}  // namespace peregrine
