#include "peregrine/engine.h"

#include "core/error.h"

namespace peregrine {

bool RequestStream::next(RequestOutput& out) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
    if (queue_.empty()) return false;
    out = std::move(queue_.front());
    queue_.pop_front();
    return true;
}

bool RequestStream::next_for(RequestOutput& out, std::chrono::milliseconds timeout, bool* timed_out) {
    std::unique_lock<std::mutex> lock(mu_);
    *timed_out = !cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || closed_; });
    if (*timed_out || queue_.empty()) return false;
    out = std::move(queue_.front());
    queue_.pop_front();
    return true;
}

void RequestStream::push(RequestOutput out, bool last) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(out));
        closed_ = closed_ || last;
    }
    cv_.notify_all();
}

Engine::Engine(const EngineConfig& config, std::unique_ptr<ModelExecutor> executor,
               std::shared_ptr<const TextProcessor> text)
    : executor_(std::move(executor)), core_(config, *executor_, std::move(text)) {
    stats_ = core_.stats();
    thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
    shutdown();
}

std::shared_ptr<RequestStream> Engine::submit(Request request) {
    core_.check_request(request);  // immutable state only
    auto stream = std::make_shared<RequestStream>(request.id);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) fail("the engine is shutting down");
        if (!live_.emplace(request.id, stream).second) fail("a request with id '", request.id, "' is already running");
        incoming_.emplace_back(std::move(request), stream);
    }
    cv_.notify_all();
    return stream;
}

void Engine::abort(const std::string& id) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        aborts_.push_back(id);
    }
    cv_.notify_all();
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

void Engine::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void Engine::loop() {
    std::unordered_map<std::string, std::shared_ptr<RequestStream>> streams;  // engine-thread copy
    for (;;) {
        std::vector<std::pair<Request, std::shared_ptr<RequestStream>>> incoming;
        std::vector<std::string> aborts;
        bool stopping;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !incoming_.empty() || !aborts_.empty() || core_.has_unfinished(); });
            incoming.swap(incoming_);
            aborts.swap(aborts_);
            stopping = stop_;
        }
        for (auto& [req, stream] : incoming) {
            const std::string id = req.id;
            try {
                core_.add_request(std::move(req));
                streams[id] = stream;
            } catch (const Error& e) {  // checked at submit; only a race could get here
                RequestOutput out;
                out.request_id = id;
                out.finish = FinishReason::Abort;
                out.stop_reason = e.what();
                stream->push(std::move(out), true);
                std::lock_guard<std::mutex> lock(mu_);
                live_.erase(id);
            }
        }
        for (const std::string& id : aborts) core_.abort_request(id);
        if (stopping)
            for (const auto& [id, stream] : streams) core_.abort_request(id);

        std::vector<RequestOutput> outputs = core_.step();
        {
            // Free the ids before the final outputs arrive, so that a client that read its
            // last output can reuse the id at once.
            std::lock_guard<std::mutex> lock(mu_);
            for (const RequestOutput& out : outputs)
                if (out.usage) live_.erase(out.request_id);
            stats_ = core_.stats();
        }
        for (RequestOutput& out : outputs) {
            auto it = streams.find(out.request_id);
            if (it == streams.end()) continue;
            const bool last = out.usage.has_value();
            it->second->push(std::move(out), last);
            if (last) streams.erase(it);
        }
        if (stopping && !core_.has_unfinished()) return;
    }
}

}  // namespace peregrine
