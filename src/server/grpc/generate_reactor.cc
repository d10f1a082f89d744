#include "server/grpc/generate_reactor.h"

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

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
               Ticket ticket, std::optional<ToolCallSetup> tools) {
        id_ = stream->id();
        tools_ = std::move(tools);
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
        for (const RequestOutput& o : outs) queue_.push_back(message_of(o));
        ended_ |= done;
        write_next();
    }

    pb::GenerateResponse message_of(const RequestOutput& o) {
        pb::GenerateResponse r = to_proto(o);
        if (!tools_) return r;
        const size_t i = static_cast<size_t>(o.index);
        if (choice_tools_.size() <= i) choice_tools_.resize(i + 1);
        if (!choice_tools_[i]) choice_tools_[i] = std::make_unique<ChoiceToolCalls>(*tools_);
        add_tool_calls(*choice_tools_[i], o, r);
        return r;
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
    Ticket ticket_;                       // the request's share of the in-flight limits, until its last output
    std::optional<ToolCallSetup> tools_;  // the request's choices carry tool calls
    std::vector<std::unique_ptr<ChoiceToolCalls>> choice_tools_;  // by choice index
    std::deque<pb::GenerateResponse> queue_;
    pb::GenerateResponse current_;
    bool started_ = false, writing_ = false, ended_ = false, cancelled_ = false, finished_ = false;
};

}  // namespace

grpc::ServerWriteReactor<pb::GenerateResponse>* start_generate(
    CompletionService& service, std::string peer,
    const std::function<std::shared_ptr<RequestStream>(Ticket*, std::optional<ToolCallSetup>*)>& submit) {
    std::shared_ptr<GenerateReactor> r;
    GenerateReactor* raw = GenerateReactor::create(service, std::move(peer), &r);
    std::shared_ptr<RequestStream> stream;
    Ticket ticket;
    std::optional<ToolCallSetup> tools;
    const grpc::Status s = guarded([&] {
        stream = submit(&ticket, &tools);
        return grpc::Status::OK;
    });
    if (!s.ok())
        raw->fail(s);
    else
        raw->start(r, stream, std::move(ticket), std::move(tools));
    return raw;
}

}  // namespace peregrine::server
