// Prefix-cache events on the wire, as vLLM publishes them (so llm-d's KV-cache indexer, the
// inference gateway's prefix scorer and our router read Peregrine without an adapter):
//
//   a ZMQ PUB socket bound at `endpoint` sends, per engine step that changed the prefix cache,
//   the multipart message [topic, sequence number (8 bytes, big-endian), payload], where the
//   payload is the msgpack array EventBatch = [timestamp (float64 seconds since the epoch),
//   events, data_parallel_rank (nil, or the replica's index)] and each event is
//     ["BlockStored", block_hashes, parent_block_hash | nil, token_ids, block_size, lora_id (nil),
//      medium, lora_name (nil)]
//     ["BlockRemoved", block_hashes, medium]
//     ["AllBlocksCleared"]
//   with `medium` "GPU" for the engine's KV pool (whatever the backend: the primary tier) and
//   "CPU" for the host tier (--kv-offload-memory): a block evicted from the pool to the host
//   tier is a BlockRemoved "GPU" then a BlockStored "CPU"; one dropped from the host tier a
//   BlockRemoved "CPU" (then a BlockStored "DISK" when it is written to the disk tier,
//   --kv-offload-disk; a block leaving the disk tier is a BlockRemoved "DISK", one read back
//   from it a BlockStored "CPU"); one copied back a BlockStored "GPU";
//
//   a ZMQ ROUTER socket bound at `replay_endpoint` (optional) answers a client's
//   [empty frame, start sequence number (8 bytes, big-endian)] with every buffered batch from
//   that number on, as [empty, sequence (8 bytes), payload] each, then [empty, -1 (8 bytes,
//   two's complement), empty]. The last `buffer_steps` batches are kept.
//
// Sequence numbers start at 0 and have no gaps. The engine hands its events over on its own
// thread (publish: a queue); one thread of the publisher owns both sockets.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "peregrine/engine_types.h"

namespace peregrine::server {

struct KvEventOptions {
    std::string endpoint;         // e.g. tcp://*:5557
    std::string replay_endpoint;  // e.g. tcp://*:5558; empty: no replay
    std::string topic;            // the first frame of every message (vLLM's default: empty)
    int buffer_steps = 10000;     // batches kept for replay
    int block_size = 16;          // tokens per block, in every BlockStored
    std::optional<int> data_parallel_rank;
};

// The msgpack payload of one batch (exposed for tests).
std::string encode_kv_event_batch(double timestamp, const std::vector<KvCacheEvent>& events, int block_size,
                                  std::optional<int> data_parallel_rank);

class KvEventPublisher {
  public:
    // Binds the sockets (throws Error naming the endpoint when one cannot be bound).
    explicit KvEventPublisher(KvEventOptions options);
    ~KvEventPublisher();  // sends what is queued, then closes
    KvEventPublisher(const KvEventPublisher&) = delete;
    KvEventPublisher& operator=(const KvEventPublisher&) = delete;

    // Queues one step's events (the engine's thread; returns at once).
    void publish(std::vector<KvCacheEvent> events);

  private:
    void run();
    void send_batch(const std::vector<KvCacheEvent>& events);
    void serve_replay();

    KvEventOptions options_;
    void* context_ = nullptr;
    void* pub_ = nullptr;
    void* replay_ = nullptr;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::vector<KvCacheEvent>> queue_;  // guarded by mu_
    bool stopping_ = false;                        // guarded by mu_
    int64_t next_seq_ = 0;
    std::deque<std::pair<int64_t, std::string>> buffer_;  // (sequence, payload) for replay
    std::thread thread_;
};

}  // namespace peregrine::server
