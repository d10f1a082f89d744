// The disk tier (--kv-offload-disk) with the embedded model on the CPU backend: a KV pool and a
// host tier so small that shared prefixes go through the disk file and back. Greedy outputs must
// be bitwise those of a large pool, in good runs and when the file is corrupted, truncated, too
// small or refuses writes (then with a warning: the blocks are recomputed). Disk hits count as
// cached tokens; blocks on disk are announced with medium Disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "engine/disk_block_file.h"
#include "engine/engine_core.h"
#include "support/block_invariants.h"
#include "support/engine_runs.h"
#include "support/golden_util.h"
#include "support/greedy_request.h"

namespace peregrine::testing {
namespace {

constexpr size_t kBlockBytes = 20480;  // stories260K: 16 tokens x 5 layers x (K + V) x 4 heads x 8 dims x f32
const size_t kStride = DiskBlockFile::slot_stride(kBlockBytes);

struct TempDir {
    std::string path;
    TempDir() {
        char t[] = "/tmp/pg-disk-tier-XXXXXX";
        PG_CHECK(mkdtemp(t));
        path = t;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string file() const {  // the disk tier's one file
        for (const auto& e : std::filesystem::directory_iterator(path)) return e.path().string();
        return {};
    }
};

struct TierRun {
    TokensById out;
    EngineStats stats;
    int round1_cached = 0;  // cached tokens of the second round's prompts
    std::vector<KvCacheEvent> events;
    std::string log;  // stderr
};

// `between` runs after the first round ended and its writes reached the file (the tests'
// faults: a write still queued would land after them).
TierRun run_rounds(TestModel& m, int blocks, int host_blocks, const std::string& disk_dir, int64_t disk_bytes,
                   const std::function<void()>& between = {}, EvictionPolicy eviction = EvictionPolicy::Lru) {
    auto ex =
        LocalExecutor::over(*m.backend, *m.model, blocks, 16, nullptr, static_cast<int64_t>(host_blocks * kBlockBytes));
    TierRun run;
    CoreConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 256;
    cfg.eviction = eviction;
    cfg.eos_token_ids = m.loaded->config.eos_token_ids;
    cfg.disk_dir = disk_dir;
    cfg.disk_bytes = disk_bytes;
    cfg.kv_events = [&](std::vector<KvCacheEvent> e) { run.events.insert(run.events.end(), e.begin(), e.end()); };
    ::testing::internal::CaptureStderr();
    {
        EngineCore core(cfg, *ex);
        const std::vector<Request> reqs = shared_system_requests(23, 2, 48, 20);
        for (size_t half = 0; half < 2; ++half) {
            if (half == 1 && between) {
                if (core.disk_file() != nullptr) {
                    EXPECT_TRUE(core.disk_file()->wait_writes(std::chrono::seconds(30)));
                }
                between();
            }
            for (size_t i = half * 6; i < half * 6 + 6; ++i) core.add_request(reqs[i]);
            for (int guard = 0; core.has_unfinished() && guard < 100000; ++guard) {
                for (const RequestOutput& o : core.step()) {
                    auto& v = run.out[o.request_id];
                    v.insert(v.end(), o.token_ids.begin(), o.token_ids.end());
                    if (o.usage && half == 1) run.round1_cached += o.usage->cached_tokens;
                }
                check_invariants(core);
            }
        }
        EXPECT_EQ(core.block_manager().num_used(), 0);
        run.stats = core.stats();
    }
    run.log = ::testing::internal::GetCapturedStderr();
    return run;
}

struct DiskTier : ::testing::Test {
    static void SetUpTestSuite() {
        model = new TestModel(models_dir() + "/stories260K");
        large = new TierRun(run_rounds(*model, 256, 0, "", 0));
    }
    static void TearDownTestSuite() {
        delete large;
        delete model;
    }
    static TestModel* model;
    static TierRun* large;  // the reference: nothing evicted
    TempDir dir;
};
TestModel* DiskTier::model = nullptr;
TierRun* DiskTier::large = nullptr;

TEST_F(DiskTier, TinyPoolAndHostTierThroughDiskMatchALargePool) {
    // 7 blocks: one sequence; 4 host slots: one prompt's full blocks.
    const TierRun none = run_rounds(*model, 7, 4, "", 0);
    const TierRun disk = run_rounds(*model, 7, 4, dir.path, 256 * kStride);
    EXPECT_EQ(disk.out, large->out);
    EXPECT_EQ(none.out, large->out);
    EXPECT_EQ(disk.stats.num_disk_kv_blocks, 256);
    EXPECT_GT(disk.stats.kv_disk_written_blocks, 0u);
    EXPECT_GT(disk.stats.kv_disk_read_blocks, 0u);
    EXPECT_EQ(disk.stats.kv_disk_read_bytes, disk.stats.kv_disk_read_blocks * kBlockBytes);
    EXPECT_GT(disk.stats.kv_disk_written_bytes, 0u);
    EXPECT_GT(disk.stats.disk_prefix_hits, 0u);
    EXPECT_LE(disk.stats.disk_prefix_hits, disk.stats.disk_prefix_queries);
    EXPECT_EQ(disk.stats.disk_read_failures + disk.stats.disk_write_failures, 0u);
    EXPECT_GT(disk.stats.num_disk_kv_blocks_used, 0);
    EXPECT_EQ(disk.stats.disk_slot_bytes, kStride);
    // The second round's prompts come back from disk as cached tokens, most as in the large pool
    // (a host tier of 4 slots loses a block when one schedule offloads more than 4 into it).
    EXPECT_GT(disk.round1_cached, none.round1_cached);
    EXPECT_GE(disk.round1_cached * 4, large->round1_cached * 3) << large->round1_cached;
    EXPECT_EQ(disk.log.find("warning"), std::string::npos) << disk.log;
    // The other eviction policies, with a disk tier that must evict too.
    for (const EvictionPolicy p : {EvictionPolicy::Lfu, EvictionPolicy::Fifo}) {
        const TierRun other = run_rounds(*model, 7, 4, dir.path, 12 * kStride, {}, p);
        EXPECT_EQ(other.out, large->out);
        EXPECT_GT(other.stats.kv_disk_read_blocks, 0u);
    }
}

TEST_F(DiskTier, EventsAnnounceDiskBlocks) {
    const TierRun disk = run_rounds(*model, 7, 4, dir.path, 6 * kStride);  // small: blocks leave it too
    int stored = 0, removed = 0;
    for (const KvCacheEvent& e : disk.events) {
        if (e.medium != KvCacheEvent::Medium::Disk) continue;
        if (e.kind == KvCacheEvent::Kind::BlockStored) {
            ++stored;
            EXPECT_EQ(e.token_ids.size(), e.block_hashes.size() * 16);
        }
        removed += e.kind == KvCacheEvent::Kind::BlockRemoved;
    }
    EXPECT_GT(stored, 0);
    EXPECT_GT(removed, 0);
    EXPECT_GT(disk.stats.disk_evictions, 0u);
    EXPECT_EQ(disk.out, large->out);
}

TEST_F(DiskTier, CorruptedBlocksAreRecomputedWithAWarning) {
    const TierRun disk = run_rounds(*model, 7, 4, dir.path, 256 * kStride, [&] {
        const int fd = open(dir.file().c_str(), O_RDWR);
        ASSERT_GE(fd, 0);
        const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        for (size_t s = 0; s < 256; ++s)  // one stray word in every block's bytes
            ASSERT_EQ(pwrite(fd, junk, sizeof(junk), static_cast<off_t>(s * kStride + 4096)), 8);
        close(fd);
    });
    EXPECT_EQ(disk.out, large->out);
    EXPECT_GT(disk.stats.disk_read_failures, 0u);
    EXPECT_NE(disk.log.find("checksum mismatch"), std::string::npos) << disk.log;
}

TEST_F(DiskTier, ATruncatedFileIsRecomputedWithAWarning) {
    const TierRun disk =
        run_rounds(*model, 7, 4, dir.path, 256 * kStride, [&] { ASSERT_EQ(truncate(dir.file().c_str(), 0), 0); });
    EXPECT_EQ(disk.out, large->out);
    EXPECT_GT(disk.stats.disk_read_failures, 0u);
    // A read past the end is short; a slot below a later round's write (which extends the file
    // again) reads as a hole of zeros, no block header.
    const bool short_read = disk.log.find("short read") != std::string::npos;
    const bool hole = disk.log.find("the slot holds no block") != std::string::npos;
    EXPECT_TRUE(short_read || hole) << disk.log;
    EXPECT_NE(disk.log.find("block dropped, its tokens will be recomputed"), std::string::npos) << disk.log;
}

TEST_F(DiskTier, FullDiskTierAndFailingWritesKeepTheTokens) {
    // A tier of 2 blocks: it evicts all the time.
    const TierRun tiny = run_rounds(*model, 7, 4, dir.path, 2 * kStride);
    EXPECT_EQ(tiny.out, large->out);
    EXPECT_GT(tiny.stats.disk_evictions, 0u);
    EXPECT_EQ(tiny.stats.num_disk_kv_blocks, 2);

    // A file system that fills: from the second round on, writes past the first 4 slots fail
    // (EFBIG under RLIMIT_FSIZE, as ENOSPC would; the limit leaves room for the captured stderr).
    rlimit old{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    const auto previous = std::signal(SIGXFSZ, SIG_IGN);
    const TierRun full = run_rounds(*model, 7, 4, dir.path, 256 * kStride, [&] {
        rlimit lim = old;
        lim.rlim_cur = 4 * kStride;
        ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    });
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    std::signal(SIGXFSZ, previous);
    EXPECT_EQ(full.out, large->out);
    EXPECT_GT(full.stats.disk_write_failures, 0u);
    EXPECT_NE(full.log.find("write of block"), std::string::npos) << full.log;
}

TEST(DiskTierFlags, RefusedWithTheFlagAndTheNumbers) {
    auto message = [](const std::function<void()>& f) {
        try {
            f();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    TempDir dir;
    EngineConfig c;
    c.kv_offload_memory = 1 << 20;
    c.kv_offload_disk = dir.path;
    c.kv_offload_disk_size = 1 << 20;
    c.validate();
    c.kv_offload_disk = dir.path + "/missing";
    EXPECT_EQ(message([&] { c.validate(); }), "--kv-offload-disk " + dir.path + "/missing is not a writable directory");
    c.kv_offload_disk = dir.path;
    c.kv_offload_disk_size = 0;
    EXPECT_NE(message([&] { c.validate(); }).find("needs --kv-offload-disk-size BYTES > 0, got 0"), std::string::npos);
    c.kv_offload_disk_size = 1 << 20;
    c.kv_offload_memory = 0;
    EXPECT_NE(message([&] { c.validate(); }).find("needs a host tier"), std::string::npos);
    EXPECT_EQ(message([&] { DiskBlockFile f(dir.path, 1000, kBlockBytes); }),
              "--kv-offload-disk-size 1000 bytes is less than one KV block on disk (24576 bytes: 20480 of K/V plus "
              "a 64-byte header, rounded up to 4 KiB)");
    EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

TEST(DiskBlockFile, RoundTripAndChecks) {
    TempDir dir;
    DiskBlockFile f(dir.path, 3 * DiskBlockFile::slot_stride(100), 100);
    EXPECT_EQ(f.num_slots(), 3);
    std::vector<char> a(100, 'a'), got(100), other(100);
    f.write(2, 77, a.data());
    f.read(2, 77, got.data());
    f.read(2, 78, other.data());  // another block's hash
    f.read(1, 77, other.data());  // never written
    std::vector<DiskBlockFile::Done> done;
    for (int i = 0; i < 1000 && done.size() < 4; ++i) {
        f.wait_done(std::chrono::milliseconds(10));
        for (auto& d : f.take_done()) done.push_back(d);
    }
    ASSERT_EQ(done.size(), 4u);
    EXPECT_TRUE(done[0].ok && !done[0].is_read);
    EXPECT_TRUE(done[1].ok && done[1].is_read);
    EXPECT_EQ(got, a);
    EXPECT_FALSE(done[2].ok);
    EXPECT_FALSE(done[3].ok);
    EXPECT_EQ(f.bytes_written(), 100u);
    EXPECT_EQ(f.bytes_read(), 100u);
}

}  // namespace
}  // namespace peregrine::testing
