// The engine behind every front end: a thread running schedule → run → sample → emit, fed
// by `submit` from any thread, answering through one stream per request.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine_core.h"
#include "peregrine/engine_types.h"

namespace peregrine {

// The outputs of one request, in order. Filled by the engine thread, read by one consumer.
class RequestStream {
  public:
    explicit RequestStream(std::string id) : id_(std::move(id)) {}
    const std::string& id() const { return id_; }

    // Blocks until the next output; false once the request has ended and all was read.
    bool next(RequestOutput& out);
    // As next(), giving up after `timeout` (then returns false with *timed_out = true).
    bool next_for(RequestOutput& out, std::chrono::milliseconds timeout, bool* timed_out);

  private:
    friend class Engine;
    void push(RequestOutput out, bool last);

    std::string id_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<RequestOutput> queue_;
    bool closed_ = false;
};

class Engine {
  public:
    Engine(const EngineConfig& config, std::unique_ptr<ModelExecutor> executor,
           std::shared_ptr<const TextProcessor> text);
    ~Engine();  // shutdown()
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

  private:
    void loop();

    std::unique_ptr<ModelExecutor> executor_;
    EngineCore core_;  // engine thread only

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::pair<Request, std::shared_ptr<RequestStream>>> incoming_;
    std::vector<std::string> aborts_;
    std::unordered_map<std::string, std::shared_ptr<RequestStream>> live_;  // id -> stream, submit to end
    EngineStats stats_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace peregrine
