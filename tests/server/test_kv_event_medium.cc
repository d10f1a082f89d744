// The `medium` of KV events on the wire: "GPU" for the KV pool, "CPU" for the host tier, "DISK"
// for the disk tier (vLLM's convention), as the last string of BlockStored and BlockRemoved.
#include <gtest/gtest.h>

#include <string>

#include "server/kv_events.h"

namespace peregrine::server {
namespace {

size_t count(const std::string& hay, const std::string& needle) {
    size_t n = 0;
    for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
    return n;
}

TEST(KvEventMedium, HostTierEventsSayCpu) {
    KvCacheEvent stored;
    stored.kind = KvCacheEvent::Kind::BlockStored;
    stored.medium = KvCacheEvent::Medium::Cpu;
    stored.block_hashes = {7};
    stored.token_ids = {1, 2};
    KvCacheEvent removed;
    removed.kind = KvCacheEvent::Kind::BlockRemoved;
    removed.medium = KvCacheEvent::Medium::Cpu;
    removed.block_hashes = {7};
    KvCacheEvent gpu_removed = removed;
    gpu_removed.medium = KvCacheEvent::Medium::Gpu;
    const std::string payload = encode_kv_event_batch(1.0, {gpu_removed, stored, removed}, 2, std::nullopt);
    const std::string cpu = std::string("\xa3") + "CPU", gpu = std::string("\xa3") + "GPU";  // msgpack fixstr
    EXPECT_EQ(count(payload, cpu), 2u);
    EXPECT_EQ(count(payload, gpu), 1u);
    // The default stays "GPU".
    KvCacheEvent plain;
    plain.kind = KvCacheEvent::Kind::BlockRemoved;
    plain.block_hashes = {1};
    EXPECT_EQ(count(encode_kv_event_batch(1.0, {plain}, 2, std::nullopt), gpu), 1u);
}

TEST(KvEventMedium, DiskTierEventsSayDisk) {
    KvCacheEvent stored;
    stored.kind = KvCacheEvent::Kind::BlockStored;
    stored.medium = KvCacheEvent::Medium::Disk;
    stored.block_hashes = {9};
    stored.token_ids = {1, 2};
    KvCacheEvent removed = stored;
    removed.kind = KvCacheEvent::Kind::BlockRemoved;
    removed.token_ids.clear();
    const std::string payload = encode_kv_event_batch(1.0, {stored, removed}, 2, std::nullopt);
    EXPECT_EQ(count(payload, std::string("\xa4") + "DISK"), 2u);  // msgpack fixstr of 4 bytes
}

}  // namespace
}  // namespace peregrine::server
