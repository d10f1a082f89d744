// The disk tier's bytes (--kv-offload-disk DIR --kv-offload-disk-size BYTES): one preallocated
// file DIR/peregrine-kv-<pid>-<n>.bin of num_slots() slots, and one I/O thread that runs the
// writes and reads in the order they were asked for (so a read of a slot sees every earlier
// write to it, and a later write comes after it).
//
// Slot s starts at s * slot_stride(block_bytes): a 64-byte header {magic, block hash, XXH3-64
// checksum of the block's bytes, block_bytes} then the block's bytes (one host-tier slot: every
// layer's K then V), the stride rounded up to 4 KiB. A read succeeds only when the header's
// magic, hash and size are the expected ones and the checksum matches what was read; anything
// else (short read, a file truncated or overwritten, a failed or partial write) is a failure,
// reported with its reason, never bytes handed on. The bookkeeping (which block is where) is the
// engine's (BlockManager's disk HostBlockPool); this class knows only slots and hashes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace peregrine {

class DiskBlockFile {
  public:
    static constexpr size_t kHeaderBytes = 64;
    // Writes queued and not yet done above which a new one is skipped (reported failed, with no
    // reason): staging memory stays below this many blocks when the disk is slower than eviction.
    static constexpr size_t kMaxQueuedWrites = 256;

    static size_t slot_stride(size_t block_bytes);
    // Throws Error naming the flag and the numbers: `dir` not a writable directory, `bytes` less
    // than one slot, or the file cannot be created or its space reserved.
    DiskBlockFile(const std::string& dir, int64_t bytes, size_t block_bytes);
    ~DiskBlockFile();  // stops the thread (queued work is dropped), closes and removes the file
    DiskBlockFile(const DiskBlockFile&) = delete;
    DiskBlockFile& operator=(const DiskBlockFile&) = delete;

    int num_slots() const { return num_slots_; }
    size_t block_bytes() const { return block_bytes_; }
    const std::string& path() const { return path_; }

    // Copies `block` (block_bytes) now, then writes it to `slot` stamped with `hash`.
    void write(int32_t slot, uint64_t hash, const void* block);
    // Reads `slot` into `dst` (block_bytes, which nobody else touches until the answer), checking
    // that it holds `hash` intact.
    void read(int32_t slot, uint64_t hash, void* dst);

    struct Done {
        bool is_read = false;
        int32_t slot = -1;
        uint64_t hash = 0;
        bool ok = false;
        std::string error;  // why it failed (empty: skipped, or ok)
    };
    std::vector<Done> take_done();
    // Blocks until an answer is waiting or `timeout` passed.
    void wait_done(std::chrono::milliseconds timeout);
    // Blocks until every write asked for so far has reached the file (or failed), or `timeout`
    // passed; returns whether none is left.
    bool wait_writes(std::chrono::milliseconds timeout);

    uint64_t bytes_written() const { return bytes_written_.load(); }  // of good writes
    uint64_t bytes_read() const { return bytes_read_.load(); }        // of good reads

  private:
    struct Job {
        bool is_read = false;
        int32_t slot = -1;
        uint64_t hash = 0;
        std::unique_ptr<char[]> staged;  // a write's header + bytes
        void* dst = nullptr;             // a read's destination
    };
    void run();
    Done execute(Job& job);

    std::string path_;
    int fd_ = -1;
    size_t block_bytes_ = 0, stride_ = 0;
    int num_slots_ = 0;
    std::mutex mu_;
    std::condition_variable work_cv_, done_cv_;
    std::deque<Job> queue_;
    size_t queued_writes_ = 0;  // queued or running
    std::vector<Done> done_;
    bool stop_ = false;
    std::atomic<uint64_t> bytes_written_{0}, bytes_read_{0};
    std::thread thread_;
};

}  // namespace peregrine
