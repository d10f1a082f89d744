#include "server/stream_pump.h"

namespace peregrine::server {

StreamPump::StreamPump(std::chrono::microseconds interval) : interval_(interval) {
    thread_ = std::thread([this] { loop(); });
}

StreamPump::~StreamPump() {
    stop();
}

void StreamPump::add(std::vector<std::shared_ptr<RequestStream>> streams, Sink sink) {
    Job job;
    job.num_open = streams.size();
    job.streams = std::move(streams);
    job.sink = std::move(sink);
    {
        std::lock_guard<std::mutex> lock(mu_);
        incoming_.push_back(std::move(job));
        ++num_jobs_;
    }
    cv_.notify_one();
}

void StreamPump::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
}

size_t StreamPump::num_jobs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return num_jobs_;
}

void StreamPump::loop() {
    std::vector<Job> jobs;
    std::vector<RequestOutput> found;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (jobs.empty()) cv_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
            if (stop_) return;
            for (Job& j : incoming_) jobs.push_back(std::move(j));
            incoming_.clear();
        }
        bool any = false;
        size_t num_done = 0;
        for (Job& job : jobs) {
            for (auto& stream : job.streams) {
                if (!stream) continue;
                RequestOutput out;
                bool timed_out = false;
                while (stream->next_for(out, std::chrono::milliseconds(0), &timed_out)) found.push_back(std::move(out));
                if (!timed_out) {  // closed and drained
                    stream.reset();
                    --job.num_open;
                }
            }
            const bool done = job.num_open == 0;
            if (done) {
                std::lock_guard<std::mutex> lock(mu_);
                --num_jobs_;
            }
            if (!found.empty() || done) {
                any = true;
                job.sink(std::move(found), done);
                found.clear();
            }
            if (done) ++num_done;
        }
        if (num_done > 0) std::erase_if(jobs, [](const Job& j) { return j.num_open == 0; });
        if (!any && !jobs.empty()) {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait_for(lock, interval_, [&] { return stop_ || !incoming_.empty(); });
        }
    }
}

}  // namespace peregrine::server
