#include "server/grpc/generate_reactor.h"

#include <chrono>
#include <deque>
#include <mutex>
#include <optional>

#include "server/grpc/proto_convert.h"
#include "server/middleware.h"

namespace peregrine::server {

namespace pb = ::peregrine::v1;

namespace {

// One Generate stream: engine outputs arrive from the StreamPump thread and are written one at a
// time; a cancel (client gone, deadline passed) aborts the engine request.
class GenerateReactor : public grpc::ServerWriteReactor<pb::GenerateResponse> {
  public:
    GenerateReactor(CompletionService& service, std::string peer)
        : service_(service), peer_(std::move(peer)), start_(std::chrono::steady_clock::now()) {}

    static GenerateReactor* create(CompletionService& service, std::string peer,
                                   std::shared_ptr<GenerateReactor>* out) {
        auto r = std::make_shared<GenerateReactor>(service, std::move(peer));
        r->self_ = r;
        *out = r;
        return r.get();
    }

    void fail(const grpc::Status& status) {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        finish(status);
    }

    void start(const std::shared_ptr<GenerateReactor>& self, const std::shared_ptr<RequestStream>& stream,
               Ticket ticket) {
        id_ = stream->id();
        started_ = true;
        ticket_ = std::move(ticket);
        service_.pump().add(
            {stream}, [self](std::vector<RequestOutput>&& outs, bool done) { self->deliver(std::move(outs), done); });
    }

    void OnWriteDone(bool ok) override {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        writing_ = false;
        if (!ok) cancelled_ = true;
        write_next();
    }

    void OnCancel() override {
        {
            std::lock_guard<std::recursive_mutex> lock(mu_);
            cancelled_ = true;
            if (started_ && !ended_ && service_.model()) service_.model()->engine->abort(id_);
            write_next();
        }
    }

    void OnDone() override {
        std::shared_ptr<GenerateReactor> keep;
        std::lock_guard<std::recursive_mutex> lock(mu_);
        keep = std::move(self_);  // the pump's sink may still hold one
    }

  private:
    void deliver(std::vector<RequestOutput>&& outs, bool done) {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        for (const RequestOutput& o : outs) {
            if (o.usage && o.timing) service_.metrics().observe_request(o.finish, *o.usage, *o.timing);
            if (o.usage) usage_ = *o.usage;
        }
        if (done) {
            ticket_.release();
            ++(cancelled_ || finished_ ? service_.counters().requests_aborted : service_.counters().requests_served);
        }
        if (finished_) return;
        for (const RequestOutput& o : outs) queue_.push_back(to_proto(o));
        ended_ |= done;
        write_next();
    }

    // Ends the call (once) and writes its access-log line.
    void finish(const grpc::Status& status) {
        finished_ = true;
        if (service_.options().access_log) {
            AccessRecord r{id_,
                           peer_,
                           "GRPC",
                           "/peregrine.v1.Inference/Generate",
                           status.error_code(),
                           0,
                           usage_ ? usage_->prompt_tokens : -1,
                           usage_ ? usage_->completion_tokens : -1};
            r.duration_ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
            write_access_log(r);
        }
        Finish(status);
    }

    void write_next() {
        if (writing_ || finished_) return;
        if (cancelled_) {
            finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
        } else if (!queue_.empty()) {
            current_ = std::move(queue_.front());
            queue_.pop_front();
            writing_ = true;
            StartWrite(&current_);
        } else if (ended_) {
            finish(grpc::Status::OK);
        }
    }

    CompletionService& service_;
    const std::string peer_;
    const std::chrono::steady_clock::time_point start_;
    std::optional<Usage> usage_;             // from the request's last output
    std::shared_ptr<GenerateReactor> self_;  // until OnDone
    std::recursive_mutex mu_;                // gRPC may run reactions inline
    std::string id_;
    Ticket ticket_;  // the request's share of the in-flight limits, until its last output
    std::deque<pb::GenerateResponse> queue_;
    pb::GenerateResponse current_;
    bool started_ = false, writing_ = false, ended_ = false, cancelled_ = false, finished_ = false;
};

}  // namespace

grpc::ServerWriteReactor<pb::GenerateResponse>* start_generate(
    CompletionService& service, std::string peer,
    const std::function<std::shared_ptr<RequestStream>(Ticket*)>& submit) {
    std::shared_ptr<GenerateReactor> r;
    GenerateReactor* raw = GenerateReactor::create(service, std::move(peer), &r);
    std::shared_ptr<RequestStream> stream;
    Ticket ticket;
    const grpc::Status s = guarded([&] {
        stream = submit(&ticket);
        return grpc::Status::OK;
    });
    if (!s.ok())
        raw->fail(s);
    else
        raw->start(r, stream, std::move(ticket));
    return raw;
}

}  // namespace peregrine::server
