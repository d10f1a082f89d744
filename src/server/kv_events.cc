#include "server/kv_events.h"

#include <zmq.h>

#include <chrono>
#include <cstring>

#include "core/error.h"
#include "server/msgpack_writer.h"

namespace peregrine::server {

namespace {

std::string be64(int64_t v) {
    std::string out(8, '\0');
    const uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((u >> (8 * (7 - i))) & 0xff);
    return out;
}

int64_t from_be64(const char* p) {
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(p[i]);
    return static_cast<int64_t>(u);
}

void send_frames(void* socket, const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
        zmq_send(socket, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
}

// A multipart message, or false when none is waiting.
bool recv_frames(void* socket, std::vector<std::string>& frames) {
    frames.clear();
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, socket, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&msg);
            return false;
        }
        frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
        const bool more = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
        if (!more) return true;
    }
}

void* bind_socket(void* context, int type, const std::string& endpoint, const char* what) {
    void* s = zmq_socket(context, type);
    if (!s) fail(what, ": zmq_socket: ", zmq_strerror(zmq_errno()));
    const int linger = 1000;  // ms to flush on close
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    const int hwm = 100000;
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (zmq_bind(s, endpoint.c_str()) != 0) {
        const std::string why = zmq_strerror(zmq_errno());
        zmq_close(s);
        fail(what, ": cannot bind '", endpoint, "': ", why);
    }
    return s;
}

// vLLM's `medium` strings.
const char* medium_name(KvCacheEvent::Medium m) {
    switch (m) {
        case KvCacheEvent::Medium::Cpu:
            return "CPU";
        case KvCacheEvent::Medium::Disk:
            return "DISK";
        case KvCacheEvent::Medium::Gpu:
            break;
    }
    return "GPU";
}

}  // namespace

std::string encode_kv_event_batch(double timestamp, const std::vector<KvCacheEvent>& events, int block_size,
                                  std::optional<int> data_parallel_rank) {
    MsgpackWriter w;
    w.array(3);
    w.float64(timestamp);
    w.array(events.size());
    for (const KvCacheEvent& e : events) {
        switch (e.kind) {
            case KvCacheEvent::Kind::BlockStored:
                w.array(8);
                w.str("BlockStored");
                w.array(e.block_hashes.size());
                for (uint64_t h : e.block_hashes) w.uint(h);
                if (e.parent_block_hash)
                    w.uint(*e.parent_block_hash);
                else
                    w.nil();
                w.array(e.token_ids.size());
                for (int32_t t : e.token_ids) w.sint(t);
                w.uint(static_cast<uint64_t>(block_size));
                w.nil();  // lora_id
                w.str(medium_name(e.medium));
                w.nil();  // lora_name
                break;
            case KvCacheEvent::Kind::BlockRemoved:
                w.array(3);
                w.str("BlockRemoved");
                w.array(e.block_hashes.size());
                for (uint64_t h : e.block_hashes) w.uint(h);
                w.str(medium_name(e.medium));
                break;
            case KvCacheEvent::Kind::AllBlocksCleared:
                w.array(1);
                w.str("AllBlocksCleared");
                break;
        }
    }
    if (data_parallel_rank)
        w.sint(*data_parallel_rank);
    else
        w.nil();
    return w.bytes();
}

KvEventPublisher::KvEventPublisher(KvEventOptions options) : options_(std::move(options)) {
    if (options_.buffer_steps < 0) fail("--kv-events-buffer-steps must be >= 0, got ", options_.buffer_steps);
    context_ = zmq_ctx_new();
    if (!context_) fail("KV events: zmq_ctx_new failed");
    try {
        pub_ = bind_socket(context_, ZMQ_PUB, options_.endpoint, "--kv-events-endpoint");
        if (!options_.replay_endpoint.empty())
            replay_ = bind_socket(context_, ZMQ_ROUTER, options_.replay_endpoint, "--kv-events-replay-endpoint");
    } catch (...) {
        if (pub_) zmq_close(pub_);
        zmq_ctx_term(context_);
        throw;
    }
    thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    zmq_close(pub_);
    if (replay_) zmq_close(replay_);
    zmq_ctx_term(context_);
}

void KvEventPublisher::publish(std::vector<KvCacheEvent> events) {
    {
        std::lock_guard lock(mu_);
        queue_.push_back(std::move(events));
    }
    cv_.notify_one();
}

// Batches go out as they come; between them, replay requests are answered every 10 ms.
void KvEventPublisher::run() {
    for (;;) {
        std::deque<std::vector<KvCacheEvent>> batches;
        bool stopping = false;
        {
            std::unique_lock lock(mu_);
            cv_.wait_for(lock, std::chrono::milliseconds(10), [&] { return !queue_.empty() || stopping_; });
            batches.swap(queue_);
            stopping = stopping_;
        }
        for (const auto& events : batches) send_batch(events);
        if (replay_) serve_replay();
        if (stopping) return;
    }
}

void KvEventPublisher::send_batch(const std::vector<KvCacheEvent>& events) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const int64_t seq = next_seq_++;
    std::string payload = encode_kv_event_batch(now, events, options_.block_size, options_.data_parallel_rank);
    send_frames(pub_, {options_.topic, be64(seq), payload});
    if (options_.buffer_steps > 0) {
        buffer_.emplace_back(seq, std::move(payload));
        while (static_cast<int>(buffer_.size()) > options_.buffer_steps) buffer_.pop_front();
    }
}

void KvEventPublisher::serve_replay() {
    std::vector<std::string> frames;
    while (recv_frames(replay_, frames)) {
        // [client identity, empty delimiter, start (8 bytes)]; anything else is not a request.
        if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) continue;
        const std::string& client = frames[0];
        const int64_t start = from_be64(frames[2].data());
        for (const auto& [seq, payload] : buffer_)
            if (seq >= start) send_frames(replay_, {client, "", be64(seq), payload});
        send_frames(replay_, {client, "", be64(-1), ""});
    }
}

}  // namespace peregrine::server
