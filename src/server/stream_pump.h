// Moves engine outputs from RequestStreams to the connections that wait for them, without
// blocking an I/O thread on RequestStream::next(): one thread drains every live stream with a
// zero timeout, hands what it found to each job's sink, and sleeps a short interval when a round
// found nothing. Thousands of concurrent streams cost one thread and a lock per stream per round.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "peregrine/engine.h"

namespace peregrine::server {

class StreamPump {
  public:
    // Called on the pump thread with the outputs found in one round (in order per stream);
    // `done` is true exactly once, on the last call, when every stream of the job has ended.
    // Keep it short: post the work elsewhere.
    using Sink = std::function<void(std::vector<RequestOutput>&& outputs, bool done)>;

    explicit StreamPump(std::chrono::microseconds interval = std::chrono::microseconds(500));
    ~StreamPump();  // stop()
    StreamPump(const StreamPump&) = delete;
    StreamPump& operator=(const StreamPump&) = delete;

    void add(std::vector<std::shared_ptr<RequestStream>> streams, Sink sink);
    // Ends the thread; jobs still open are dropped without a last call.
    void stop();
    size_t num_jobs() const;

  private:
    struct Job {
        std::vector<std::shared_ptr<RequestStream>> streams;  // null once ended
        Sink sink;
        size_t num_open = 0;
    };
    void loop();

    const std::chrono::microseconds interval_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Job> incoming_;
    size_t num_jobs_ = 0;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace peregrine::server
