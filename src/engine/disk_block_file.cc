#include "engine/disk_block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace peregrine {
namespace {

constexpr uint64_t kMagic = 0x31766b6e69726770;  // "pgrinkv1"

struct Header {
    uint64_t magic = 0, hash = 0, checksum = 0, bytes = 0;
};
static_assert(sizeof(Header) <= DiskBlockFile::kHeaderBytes);

std::atomic<int> g_files{0};  // a process may hold several engines (tests)

}  // namespace

size_t DiskBlockFile::slot_stride(size_t block_bytes) {
    return (kHeaderBytes + block_bytes + 4095) / 4096 * 4096;
}

DiskBlockFile::DiskBlockFile(const std::string& dir, int64_t bytes, size_t block_bytes)
    : block_bytes_(block_bytes), stride_(slot_stride(block_bytes)) {
    PG_CHECK(block_bytes > 0);
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || access(dir.c_str(), W_OK | X_OK) != 0)
        fail("--kv-offload-disk ", dir, " is not a writable directory");
    if (bytes < static_cast<int64_t>(stride_))
        fail("--kv-offload-disk-size ", bytes, " bytes is less than one KV block on disk (", stride_,
             " bytes: ", block_bytes, " of K/V plus a ", kHeaderBytes, "-byte header, rounded up to 4 KiB)");
    num_slots_ = static_cast<int>(std::min<int64_t>(bytes / static_cast<int64_t>(stride_), INT32_MAX));
    path_ = dir + "/peregrine-kv-" + std::to_string(getpid()) + "-" + std::to_string(g_files++) + ".bin";
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) fail("--kv-offload-disk: cannot create ", path_, ": ", std::strerror(errno));
    // Reserve the space now, so a full file system shows at start rather than as failed writes
    // (where fallocate is not supported, a sparse file: then a full disk fails writes later).
    const off_t size = static_cast<off_t>(num_slots_) * static_cast<off_t>(stride_);
    int rc = posix_fallocate(fd_, 0, size);
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd_, size) == 0 ? 0 : errno;
    if (rc != 0) {
        close(fd_);
        unlink(path_.c_str());
        fail("--kv-offload-disk-size ", bytes, " bytes: cannot reserve ", size, " bytes in ", path_, ": ",
             std::strerror(rc));
    }
    thread_ = std::thread([this] { run(); });
}

DiskBlockFile::~DiskBlockFile() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    thread_.join();
    close(fd_);
    unlink(path_.c_str());
}

void DiskBlockFile::write(int32_t slot, uint64_t hash, const void* block) {
    PG_CHECK(slot >= 0 && slot < num_slots_, "disk slot ", slot);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (queued_writes_ >= kMaxQueuedWrites) {
            done_.push_back({false, slot, hash, false, {}});
            done_cv_.notify_all();
            return;
        }
    }
    Job job;
    job.slot = slot;
    job.hash = hash;
    job.staged = std::make_unique<char[]>(kHeaderBytes + block_bytes_);
    std::memcpy(job.staged.get() + kHeaderBytes, block, block_bytes_);
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++queued_writes_;
        queue_.push_back(std::move(job));
    }
    work_cv_.notify_one();
}

void DiskBlockFile::read(int32_t slot, uint64_t hash, void* dst) {
    PG_CHECK(slot >= 0 && slot < num_slots_, "disk slot ", slot);
    Job job;
    job.is_read = true;
    job.slot = slot;
    job.hash = hash;
    job.dst = dst;
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(job));
    }
    work_cv_.notify_one();
}

std::vector<DiskBlockFile::Done> DiskBlockFile::take_done() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(done_, {});
}

void DiskBlockFile::wait_done(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait_for(lock, timeout, [&] { return !done_.empty(); });
}

bool DiskBlockFile::wait_writes(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return done_cv_.wait_for(lock, timeout, [&] { return queued_writes_ == 0; });
}

void DiskBlockFile::run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        Job job = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        Done d = execute(job);
        lock.lock();
        if (!job.is_read) --queued_writes_;
        done_.push_back(std::move(d));
        done_cv_.notify_all();
    }
}

// Runs one job on the I/O thread (no lock held).
DiskBlockFile::Done DiskBlockFile::execute(Job& job) {
    Done d{job.is_read, job.slot, job.hash, false, {}};
    const off_t at = static_cast<off_t>(job.slot) * static_cast<off_t>(stride_);
    const size_t total = kHeaderBytes + block_bytes_;
    auto io_error = [&](const char* what, ssize_t n) {
        d.error = n < 0 ? std::string(what) + ": " + std::strerror(errno)
                        : std::string("short ") + what + " (" + std::to_string(n) + " of " + std::to_string(total) +
                              " bytes)";
    };
    if (!job.is_read) {
        char* buf = job.staged.get();
        Header h{kMagic, job.hash, XXH3_64bits(buf + kHeaderBytes, block_bytes_), block_bytes_};
        std::memset(buf, 0, kHeaderBytes);
        std::memcpy(buf, &h, sizeof(h));
        ssize_t n;
        do n = pwrite(fd_, buf, total, at);
        while (n < 0 && errno == EINTR);
        if (n != static_cast<ssize_t>(total)) {
            io_error("write", n);
            return d;
        }
        bytes_written_ += block_bytes_;
        d.ok = true;
        return d;
    }
    char head[kHeaderBytes];
    iovec iov[2] = {{head, kHeaderBytes}, {job.dst, block_bytes_}};
    ssize_t n;
    do n = preadv(fd_, iov, 2, at);
    while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(total)) {
        io_error("read", n);
        return d;
    }
    Header h;
    std::memcpy(&h, head, sizeof(h));
    if (h.magic != kMagic || h.bytes != block_bytes_ || h.hash != job.hash) {
        d.error = "the slot holds no block or another one";
        return d;
    }
    if (XXH3_64bits(job.dst, block_bytes_) != h.checksum) {
        d.error = "checksum mismatch";
        return d;
    }
    bytes_read_ += block_bytes_;
    d.ok = true;
    return d;
}

}  // namespace peregrine
