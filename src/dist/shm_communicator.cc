#include "dist/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace peregrine {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x314d434d48534750ull;  // the bytes "PGSHMCM1" read as a little-endian u64
constexpr uint32_t kVersion = 1;
constexpr uint32_t kStateSizing = 0;
constexpr uint32_t kStateReady = 1;    // header written, ranks may join
constexpr uint32_t kStateStarted = 2;  // every rank joined; the name is unlinked
constexpr size_t kPage = 4096;
constexpr int kSpins = 1000;                                    // pauses (~10-100 us) before sleeping on the futex
constexpr auto kSleepSlice = std::chrono::milliseconds(10);     // longest futex sleep between checks
constexpr auto kRendezvousPoll = std::chrono::milliseconds(1);  // while waiting for the segment / joins
// How long a joined rank waits past the deadline for rank 0's verdict on the rendezvous.
constexpr auto kRendezvousGrace = std::chrono::seconds(2);

enum Op : uint32_t { kAllReduce = 1, kAllGather, kBroadcast, kBarrier };

const char* op_name(uint32_t op) {
    switch (op) {
        case kAllReduce:
            return "all_reduce_sum";
        case kAllGather:
            return "all_gather";
        case kBroadcast:
            return "broadcast";
        case kBarrier:
            return "barrier";
        default:
            return "?";
    }
}

// --- the segment's records (plain data; shared words are accessed through std::atomic_ref) ---

struct Header {  // at offset 0, padded to kPage
    uint64_t magic;
    uint32_t version;
    uint32_t state;        // kStateSizing -> kStateReady -> kStateStarted
    uint32_t size;         // ranks
    uint32_t abort_claim;  // 0 -> 1 by the one rank that writes abort_message
    uint32_t aborted;      // 0, or 1 + the rank that gave up first (set after abort_message)
    uint32_t reserved;
    uint64_t staging_bytes;  // per rank
    uint64_t channel_bytes;  // per ordered pair
    uint64_t total_bytes;    // of the whole segment
    alignas(64) char abort_message[512];
};
static_assert(sizeof(Header) <= kPage);

struct Descriptor {  // one collective as one rank called it
    uint32_t op;
    uint32_t dtype;
    uint64_t count;
    int32_t root;
    uint32_t reserved;
};

struct RankSlot {                    // 192 bytes per rank
    int32_t pid;                     // 0 until the rank claims the slot
    uint32_t joined;                 // 1 once pid and start_time are written
    uint64_t start_time;             // clock ticks since boot (0: unknown)
    uint32_t left;                   // 1 once the rank destroyed its communicator
    alignas(64) uint32_t phase;      // the last collective phase this rank published
    uint32_t phase_waiters;          // ranks sleeping on `phase`
    alignas(64) Descriptor desc[2];  // the collective begun (index: collective number % 2)
};
static_assert(sizeof(RankSlot) == 192);

struct ChannelCtl {  // 192 bytes per ordered pair src -> dst
    uint32_t sent;   // chunks src has written (chunk k lives in slot k % 2)
    uint32_t sent_waiters;
    alignas(64) uint32_t received;  // chunks dst has taken
    uint32_t received_waiters;
    alignas(64) uint64_t msg_bytes[2];  // bytes of the whole message each slot's chunk belongs to
};
static_assert(sizeof(ChannelCtl) == 192);

size_t align_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

struct Layout {
    size_t staging_bytes;
    size_t channel_bytes;
    size_t slots_off;
    size_t channels_off;
    size_t staging_off;
    size_t chan_data_off;
    size_t total;
};

Layout make_layout(int size, size_t staging_bytes) {
    Layout l{};
    const size_t n = static_cast<size_t>(size);
    const size_t pairs = n * (n - 1);
    l.staging_bytes = staging_bytes;
    l.channel_bytes = staging_bytes / 2;
    l.slots_off = kPage;
    l.channels_off = l.slots_off + n * sizeof(RankSlot);
    l.staging_off = align_up(l.channels_off + std::max<size_t>(pairs, 1) * sizeof(ChannelCtl), kPage);
    l.chan_data_off = l.staging_off + n * l.staging_bytes;
    l.total = align_up(l.chan_data_off + pairs * l.channel_bytes, kPage);
    return l;
}

template <typename T>
std::atomic_ref<T> atom(T& x) {
    return std::atomic_ref<T>(x);
}

// Wraparound-safe "counter `value` has reached `target`" (counters of peers never differ by 2^31).
bool reached(uint32_t value, uint32_t target) {
    return static_cast<int32_t>(value - target) >= 0;
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// Shared (not FUTEX_PRIVATE): the word is in memory mapped by several processes.
void futex_wait(uint32_t* addr, uint32_t expected, std::chrono::nanoseconds rel) {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(rel.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(rel.count() % 1000000000);
    syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* addr) {
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Stores `value` and wakes sleepers. Both sides use seq_cst (the waiter bumps `waiters`, then
// re-reads the counter): either the waiter sees the new value or we see the waiter.
void publish(uint32_t& counter, uint32_t& waiters, uint32_t value) {
    atom(counter).store(value, std::memory_order_seq_cst);
    if (atom(waiters).load(std::memory_order_seq_cst) != 0) futex_wake_all(&counter);
}

// Fields of /proc/<pid>/stat after the command name: state (field 3) and starttime (field 22).
struct ProcStat {
    bool exists = false;
    char state = '?';
    uint64_t start_time = 0;
};

ProcStat read_proc_stat(const std::string& path) {
    ProcStat s;
    std::ifstream f(path);
    if (!f) return s;
    std::string line;
    std::getline(f, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) return s;
    std::istringstream rest(line.substr(close + 1));
    std::string field;
    for (int i = 3; rest >> field; ++i) {
        if (i == 3) s.state = field.empty() ? '?' : field[0];
        if (i == 22) {
            s.start_time = std::strtoull(field.c_str(), nullptr, 10);
            break;
        }
    }
    s.exists = true;
    return s;
}

uint64_t own_start_time() {
    return read_proc_stat("/proc/self/stat").start_time;
}

// Whether the process (pid, start_time) still runs: a zombie (exited, not yet reaped by its
// parent) counts as gone, and so does a different process that reuses the pid.
bool process_alive(int pid, uint64_t start_time) {
    if (pid <= 0) return false;
    const ProcStat s = read_proc_stat("/proc/" + std::to_string(pid) + "/stat");
    if (s.exists) {
        if (s.state == 'Z' || s.state == 'X' || s.state == 'x') return false;
        return start_time == 0 || s.start_time == 0 || s.start_time == start_time;
    }
    return kill(pid, 0) == 0 || errno == EPERM;  // no /proc (or unreadable): ask the kernel
}

std::string seconds(double s) {
    return str_cat(s, " s");
}

// `timeout_s` from now; <= 0: a century away (not time_point::max(), so adding a grace period
// cannot overflow).
Clock::time_point deadline_after(double timeout_s) {
    const auto now = Clock::now();
    if (timeout_s <= 0) return now + std::chrono::hours(24 * 365 * 100);
    return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// memcpy that accepts a null pointer when there is nothing to copy (count 0 collectives).
void copy(void* dst, const void* src, size_t bytes) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
}

}  // namespace

// --- the mapping ---

struct ShmCommunicator::Segment {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    Layout layout{};
    int size = 0;

    ~Segment() {
        if (base != nullptr) munmap(base, bytes);
    }
    Header& header() const { return *reinterpret_cast<Header*>(base); }
    RankSlot& slot(int r) const { return reinterpret_cast<RankSlot*>(base + layout.slots_off)[static_cast<size_t>(r)]; }
    // Ordered pairs src != dst, numbered src * (size - 1) + (dst without src).
    size_t pair(int src, int dst) const {
        return static_cast<size_t>(src) * static_cast<size_t>(size - 1) +
               static_cast<size_t>(dst < src ? dst : dst - 1);
    }
    ChannelCtl& channel(int src, int dst) const {
        return reinterpret_cast<ChannelCtl*>(base + layout.channels_off)[pair(src, dst)];
    }
    // Half `half` (0 or 1) of rank r's collective staging: staging_bytes / 2 bytes.
    uint8_t* staging(int r, uint64_t half) const {
        return base + layout.staging_off + static_cast<size_t>(r) * layout.staging_bytes +
               static_cast<size_t>(half) * (layout.staging_bytes / 2);
    }
    // Chunk slot `k` (0 or 1) of the channel src -> dst: channel_bytes / 2 bytes.
    uint8_t* channel_data(int src, int dst, uint32_t k) const {
        return base + layout.chan_data_off + pair(src, dst) * layout.channel_bytes + k * (layout.channel_bytes / 2);
    }
};

namespace {

// Maps `bytes` of the open shared-memory file `fd`.
uint8_t* map_fd(int fd, size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

void sleep_for(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
}

}  // namespace

ShmCommunicator::ShmCommunicator(std::string group, int rank, int size, double timeout_s)
    : Communicator(rank, size),
      group_(std::move(group)),
      timeout_s_(timeout_s),
      pids_(static_cast<size_t>(size), 0),
      start_times_(static_cast<size_t>(size), 0),
      sent_(static_cast<size_t>(size), 0),
      taken_(static_cast<size_t>(size), 0) {}

std::unique_ptr<ShmCommunicator> ShmCommunicator::create(const std::string& group, int rank, int size, double timeout_s,
                                                         size_t staging_bytes) {
    if (group.empty() || group.size() > 200 || group.find('/') != std::string::npos)
        fail("shm communicator: group name '", group, "' must be 1 to 200 characters without '/'");
    if (size < 1 || rank < 0 || rank >= size)
        fail("shm communicator '", group, "': rank ", rank, " is not in a group of ", size);
    if (staging_bytes < 1024 || staging_bytes % 256 != 0)
        fail("shm communicator '", group, "': staging bytes ", staging_bytes, " must be a multiple of 256, >= 1024");

    std::unique_ptr<ShmCommunicator> comm(new ShmCommunicator(group, rank, size, timeout_s));
    const std::string name = "/peregrine-" + group;
    const std::string where = str_cat("shm communicator '", group, "' (rank ", rank, " of ", size, "): ");
    const Layout layout = make_layout(size, staging_bytes);
    const auto deadline = deadline_after(timeout_s);
    const int my_pid = static_cast<int>(getpid());
    const uint64_t my_start = own_start_time();
    auto seg = std::make_unique<Segment>();
    seg->layout = layout;
    seg->size = size;

    if (rank == 0) {
        // A segment of the same name is left from a crashed run (a live run would have unlinked
        // it once everyone joined): remove it. Ranks that opened it see its rank 0 gone.
        shm_unlink(name.c_str());
        const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) fail(where, "cannot create /dev/shm", name, ": ", std::strerror(errno));
        struct Unlinker {  // until every rank has joined, failure must not leave the name behind
            const std::string& name;
            bool armed = true;
            ~Unlinker() {
                if (armed) shm_unlink(name.c_str());
            }
        } unlinker{name};
        const int err = ftruncate(fd, static_cast<off_t>(layout.total)) != 0
                            ? errno
                            : posix_fallocate(fd, 0, static_cast<off_t>(layout.total));
        if (err != 0) {
            close(fd);
            fail(where, "cannot reserve ", layout.total, " bytes in /dev/shm", name, ": ", std::strerror(err));
        }
        seg->base = map_fd(fd, layout.total);
        const int map_err = errno;
        close(fd);
        if (seg->base == nullptr) fail(where, "cannot map /dev/shm", name, ": ", std::strerror(map_err));
        seg->bytes = layout.total;
        // The pages are fresh (zero); fill the header, claim slot 0, then let the others in.
        Header& h = seg->header();
        h.magic = kMagic;
        h.version = kVersion;
        h.size = static_cast<uint32_t>(size);
        h.staging_bytes = layout.staging_bytes;
        h.channel_bytes = layout.channel_bytes;
        h.total_bytes = layout.total;
        RankSlot& mine = seg->slot(0);
        mine.pid = my_pid;
        mine.start_time = my_start;
        atom(mine.joined).store(1, std::memory_order_release);
        atom(h.state).store(kStateReady, std::memory_order_release);
        comm->seg_ = std::move(seg);

        // Wait for the others; a rank that joined and died fails the rendezvous at once.
        auto next_check = Clock::now();
        for (;;) {
            std::vector<int> missing;
            for (int r = 1; r < size; ++r)
                if (atom(comm->seg_->slot(r).joined).load(std::memory_order_acquire) == 0) missing.push_back(r);
            if (missing.empty()) break;
            const auto now = Clock::now();
            if (now >= next_check) {
                next_check = now + kSleepSlice;
                for (int r = 1; r < size; ++r) {
                    RankSlot& s = comm->seg_->slot(r);
                    if (atom(s.joined).load(std::memory_order_acquire) != 0 && !process_alive(s.pid, s.start_time))
                        comm->give_up(str_cat("rank ", r, " (pid ", s.pid, ") exited during the rendezvous"));
                }
            }
            if (now >= deadline) {
                std::string list;
                for (size_t i = 0; i < missing.size(); ++i) list += str_cat(i == 0 ? "" : ", ", missing[i]);
                comm->give_up(str_cat("rendezvous timed out after ", seconds(timeout_s), ": rank",
                                      missing.size() > 1 ? "s " : " ", list, " never joined"));
            }
            sleep_for(kRendezvousPoll);
        }
        shm_unlink(name.c_str());
        unlinker.armed = false;
        atom(comm->seg_->header().state).store(kStateStarted, std::memory_order_release);
    } else {
        bool saw_stale = false;
        for (;; sleep_for(kRendezvousPoll)) {
            if (Clock::now() >= deadline)
                fail(where, "rendezvous timed out after ", seconds(timeout_s), ": rank 0 never created /dev/shm", name,
                     saw_stale ? " (only a stale segment of an earlier run was there)" : "");
            const int fd = shm_open(name.c_str(), O_RDWR, 0);
            if (fd < 0) {
                if (errno == ENOENT) continue;
                fail(where, "cannot open /dev/shm", name, ": ", std::strerror(errno));
            }
            // Map what is there (rank 0 sizes the file before it marks the header ready).
            struct stat st {};
            const size_t file_bytes = fstat(fd, &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
            uint8_t* base = file_bytes >= kPage + sizeof(RankSlot) ? map_fd(fd, file_bytes) : nullptr;
            const int map_err = errno;
            close(fd);
            if (base == nullptr) {
                if (file_bytes >= kPage + sizeof(RankSlot))
                    fail(where, "cannot map /dev/shm", name, ": ", std::strerror(map_err));
                continue;  // rank 0 is still sizing it
            }
            const Header& h = *reinterpret_cast<const Header*>(base);
            const uint32_t state = atom(const_cast<uint32_t&>(h.state)).load(std::memory_order_acquire);
            const bool ready =
                state != kStateSizing && h.magic == kMagic && h.version == kVersion && h.total_bytes == file_bytes;
            // Rank 0's slot sits at the same offset whatever the layout.
            const RankSlot& zero = *reinterpret_cast<const RankSlot*>(base + kPage);
            const bool stale = ready && (state == kStateStarted || !process_alive(zero.pid, zero.start_time));
            const bool matches = h.size == static_cast<uint32_t>(size) && h.staging_bytes == staging_bytes &&
                                 h.total_bytes == layout.total;
            const uint32_t seg_size = h.size;
            const uint64_t seg_staging = h.staging_bytes;
            if (!ready || stale || !matches) munmap(base, file_bytes);
            if (!ready) continue;
            if (stale) {
                // Left by a crashed run (a live one unlinks the name once started): rank 0 of this
                // run replaces it.
                saw_stale = true;
                continue;
            }
            if (!matches)
                fail(where, "/dev/shm", name, " was created for ", seg_size, " ranks with ", seg_staging,
                     " staging bytes; this rank expects ", size, " ranks with ", staging_bytes);
            seg->base = base;
            seg->bytes = file_bytes;
            break;
        }
        Header& h = seg->header();
        RankSlot& mine = seg->slot(rank);
        int32_t expected = 0;
        if (!atom(mine.pid).compare_exchange_strong(expected, my_pid))
            fail(where, "rank ", rank, " of this group is already taken by pid ", expected,
                 " (is another group of the same name running?)");
        mine.start_time = my_start;
        atom(mine.joined).store(1, std::memory_order_release);
        comm->seg_ = std::move(seg);
        const RankSlot& zero = comm->seg_->slot(0);
        const auto verdict_deadline = deadline + kRendezvousGrace;
        auto next_check = Clock::now();
        while (atom(h.state).load(std::memory_order_acquire) != kStateStarted) {
            if (const uint32_t a = atom(h.aborted).load(std::memory_order_acquire); a != 0) {
                comm->broken_ = str_cat(where, "rank ", a - 1, " stopped the group: ", h.abort_message);
                throw Error(comm->broken_);
            }
            const auto now = Clock::now();
            if (now >= next_check) {
                next_check = now + kSleepSlice;
                if (!process_alive(zero.pid, zero.start_time))
                    comm->give_up(str_cat("rank 0 (pid ", zero.pid, ") exited during the rendezvous"));
            }
            // Rank 0 decides (and names the missing ranks); this deadline is only for a rank 0
            // that stopped answering.
            if (now >= verdict_deadline)
                comm->give_up(str_cat("rendezvous timed out after ", seconds(timeout_s), ": not every rank joined"));
            sleep_for(kRendezvousPoll);
        }
    }
    for (int r = 0; r < size; ++r) {
        const RankSlot& s = comm->seg_->slot(r);
        comm->pids_[static_cast<size_t>(r)] = s.pid;
        comm->start_times_[static_cast<size_t>(r)] = s.start_time;
    }
    return comm;
}

ShmCommunicator::~ShmCommunicator() {
    if (!seg_ || seg_->base == nullptr) return;
    // Tell peers still waiting on this rank that it is gone (they would otherwise wait for
    // their deadline: this process may live on).
    RankSlot& mine = seg_->slot(rank_);
    atom(mine.left).store(1, std::memory_order_seq_cst);
    futex_wake_all(&mine.phase);
    for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        futex_wake_all(&seg_->channel(rank_, p).sent);
        futex_wake_all(&seg_->channel(p, rank_).received);
    }
}

std::string ShmCommunicator::name() const {
    return str_cat("shm (rank ", rank_, " of ", size_, ")");
}

void ShmCommunicator::check_usable() const {
    if (!broken_.empty()) throw Error(broken_);
}

void ShmCommunicator::give_up(const std::string& message) {
    broken_ = str_cat("shm communicator '", group_, "' (rank ", rank_, " of ", size_, "): ", message);
    if (seg_ && seg_->base != nullptr) {
        Header& h = seg_->header();
        uint32_t expected = 0;
        if (atom(h.abort_claim).compare_exchange_strong(expected, 1)) {
            const size_t n = std::min(message.size(), sizeof(h.abort_message) - 1);
            std::memcpy(h.abort_message, message.data(), n);
            h.abort_message[n] = '\0';
            atom(h.aborted).store(static_cast<uint32_t>(rank_ + 1), std::memory_order_release);
        }
    }
    throw Error(broken_);
}

void ShmCommunicator::wait_rank(int peer, uint32_t* counter, uint32_t* waiters, uint32_t target, const char* what,
                                bool names_peer) {
    for (int i = 0; i < kSpins; ++i) {
        if (reached(atom(*counter).load(std::memory_order_acquire), target)) return;
        cpu_relax();
    }
    Header& h = seg_->header();
    RankSlot& ps = seg_->slot(peer);
    const auto deadline = deadline_after(timeout_s_);
    auto next_check = Clock::now();
    const int pid = pids_[static_cast<size_t>(peer)];
    for (;;) {
        atom(*waiters).fetch_add(1, std::memory_order_seq_cst);
        const uint32_t v = atom(*counter).load(std::memory_order_seq_cst);
        if (!reached(v, target)) {
            const auto left = deadline - Clock::now();
            futex_wait(counter, v,
                       std::max<std::chrono::nanoseconds>(std::min<std::chrono::nanoseconds>(left, kSleepSlice),
                                                          std::chrono::nanoseconds(1000)));
        }
        atom(*waiters).fetch_sub(1, std::memory_order_seq_cst);
        if (reached(atom(*counter).load(std::memory_order_acquire), target)) return;

        const auto now = Clock::now();
        if (now < next_check && now < deadline) continue;
        next_check = now + kSleepSlice;
        if (const uint32_t a = atom(h.aborted).load(std::memory_order_acquire); a != 0) {
            broken_ = str_cat("shm communicator '", group_, "' (rank ", rank_, " of ", size_, "): rank ", a - 1,
                              " stopped the group: ", h.abort_message);
            throw Error(broken_);
        }
        auto doing = [&] { return names_peer ? str_cat(what, " rank ", peer) : std::string(what); };
        if (atom(ps.left).load(std::memory_order_acquire) != 0)
            give_up(str_cat("rank ", peer, " (pid ", pid, ") left the group (rank ", rank_, " was in ", doing(), ")"));
        if (!process_alive(pid, start_times_[static_cast<size_t>(peer)]))
            give_up(str_cat("rank ", peer, " (pid ", pid, ") exited (rank ", rank_, " was in ", doing(), ")"));
        if (now >= deadline)
            give_up(str_cat("rank ", peer, " did not answer within ", seconds(timeout_s_), " (rank ", rank_, " was in ",
                            doing(), ")"));
    }
}

void ShmCommunicator::phase(const char* what) {
    ++phase_;
    RankSlot& mine = seg_->slot(rank_);
    publish(mine.phase, mine.phase_waiters, phase_);
    for (int r = 0; r < size_; ++r)
        if (r != rank_) wait_rank(r, &seg_->slot(r).phase, &seg_->slot(r).phase_waiters, phase_, what);
}

void ShmCommunicator::begin_collective(uint32_t op, DType dtype, size_t count, int root, const char* what) {
    check_usable();
    const size_t which = num_collectives_ % 2;
    Descriptor& d = seg_->slot(rank_).desc[which];
    d.op = op;
    d.dtype = static_cast<uint32_t>(dtype);
    d.count = count;
    d.root = root;
    phase(what);  // its release store publishes `d`
    // The descriptor slot is reused by collective n + 2, which no rank begins before every rank
    // has passed collective n + 1's first phase, i.e. finished this check.
    for (int r = 0; r < size_; ++r) {
        const Descriptor& o = seg_->slot(r).desc[which];
        if (o.op == d.op && o.dtype == d.dtype && o.count == d.count && o.root == d.root) continue;
        auto describe = [](const Descriptor& x) {
            std::string s = str_cat(op_name(x.op), "(count ", x.count, ", ", dtype_name(static_cast<DType>(x.dtype)));
            if (x.op == kBroadcast) s += str_cat(", root ", x.root);
            return s + ")";
        };
        give_up(str_cat("collectives out of step: rank ", r, " called ", describe(o), ", rank ", rank_, " called ",
                        describe(d)));
    }
    ++num_collectives_;
}

void ShmCommunicator::all_reduce_sum(void* buf, size_t count, DType dtype) {
    const size_t elem = comm_element_size(dtype);
    const size_t chunk = seg_->layout.staging_bytes / 2 / elem;  // elements per round
    const size_t rounds = std::max<size_t>(1, (count + chunk - 1) / chunk);
    auto* out = static_cast<uint8_t*>(buf);
    const size_t n_ranks = static_cast<size_t>(size_);
    for (size_t i = 0; i < rounds; ++i, ++round_) {
        const size_t off = i * chunk;
        const size_t n = std::min(chunk, count - std::min(count, off));
        const uint64_t half = round_ % 2;
        copy(seg_->staging(rank_, half), out + off * elem, n * elem);
        if (i == 0) {
            begin_collective(kAllReduce, dtype, count, -1, "all_reduce_sum");
        } else {
            phase("all_reduce_sum");
        }
        // My slice [lo, hi) of the chunk, summed over ranks in order into my own staging half
        // (other ranks read only their own slices of it until the next phase).
        const size_t lo = n * static_cast<size_t>(rank_) / n_ranks;
        const size_t hi = n * static_cast<size_t>(rank_ + 1) / n_ranks;
        constexpr size_t kBlock = 256;
        float acc[kBlock];  // [kBlock] running sums in f32
        for (size_t b = lo; b < hi; b += kBlock) {
            const size_t m = std::min(kBlock, hi - b);
            if (dtype == DType::F32) {
                const float* s0 = reinterpret_cast<const float*>(seg_->staging(0, half)) + b;
                for (size_t j = 0; j < m; ++j) acc[j] = s0[j];
                for (int q = 1; q < size_; ++q) {
                    const float* s = reinterpret_cast<const float*>(seg_->staging(q, half)) + b;
                    for (size_t j = 0; j < m; ++j) acc[j] += s[j];
                }
                copy(reinterpret_cast<float*>(seg_->staging(rank_, half)) + b, acc, m * sizeof(float));
            } else {
                const uint16_t* s0 = reinterpret_cast<const uint16_t*>(seg_->staging(0, half)) + b;
                for (size_t j = 0; j < m; ++j) acc[j] = bf16_to_f32(s0[j]);
                for (int q = 1; q < size_; ++q) {
                    const uint16_t* s = reinterpret_cast<const uint16_t*>(seg_->staging(q, half)) + b;
                    for (size_t j = 0; j < m; ++j) acc[j] += bf16_to_f32(s[j]);
                }
                uint16_t* d = reinterpret_cast<uint16_t*>(seg_->staging(rank_, half)) + b;
                for (size_t j = 0; j < m; ++j) d[j] = f32_to_bf16(acc[j]);
            }
        }
        phase("all_reduce_sum");
        for (int q = 0; q < size_; ++q) {
            const size_t qlo = n * static_cast<size_t>(q) / n_ranks;
            const size_t qhi = n * static_cast<size_t>(q + 1) / n_ranks;
            copy(out + (off + qlo) * elem, seg_->staging(q, half) + qlo * elem, (qhi - qlo) * elem);
        }
    }
}

void ShmCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
    const size_t elem = comm_element_size(dtype);
    const size_t chunk = seg_->layout.staging_bytes / 2 / elem;
    const size_t rounds = std::max<size_t>(1, (count + chunk - 1) / chunk);
    const auto* in = static_cast<const uint8_t*>(send);
    auto* out = static_cast<uint8_t*>(recv);
    for (size_t i = 0; i < rounds; ++i, ++round_) {
        const size_t off = i * chunk;
        const size_t n = std::min(chunk, count - std::min(count, off));
        const uint64_t half = round_ % 2;
        copy(seg_->staging(rank_, half), in + off * elem, n * elem);
        if (i == 0) {
            begin_collective(kAllGather, dtype, count, -1, "all_gather");
        } else {
            phase("all_gather");
        }
        for (int q = 0; q < size_; ++q) {
            uint8_t* dst = out + (static_cast<size_t>(q) * count + off) * elem;
            // My own part comes straight from `send` (nothing to do when gathering in place).
            const uint8_t* src = q == rank_ ? in + off * elem : seg_->staging(q, half);
            if (dst != src) copy(dst, src, n * elem);
        }
    }
}

void ShmCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
    PG_CHECK(root >= 0 && root < size_, "broadcast root ", root, " is not a rank of ", size_);
    const size_t elem = comm_element_size(dtype);
    const size_t chunk = seg_->layout.staging_bytes / 2 / elem;
    const size_t rounds = std::max<size_t>(1, (count + chunk - 1) / chunk);
    auto* data = static_cast<uint8_t*>(buf);
    for (size_t i = 0; i < rounds; ++i, ++round_) {
        const size_t off = i * chunk;
        const size_t n = std::min(chunk, count - std::min(count, off));
        const uint64_t half = round_ % 2;
        if (rank_ == root) copy(seg_->staging(rank_, half), data + off * elem, n * elem);
        if (i == 0) {
            begin_collective(kBroadcast, dtype, count, root, "broadcast");
        } else {
            phase("broadcast");
        }
        if (rank_ != root) copy(data + off * elem, seg_->staging(root, half), n * elem);
    }
}

void ShmCommunicator::barrier() {
    begin_collective(kBarrier, DType::F32, 0, -1, "barrier");
}

void ShmCommunicator::send(const void* buf, size_t count, DType dtype, int peer) {
    check_usable();
    PG_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send to rank ", peer, " from rank ", rank_, " of ", size_);
    const size_t bytes = count * comm_element_size(dtype);
    const size_t slot_bytes = seg_->layout.channel_bytes / 2;
    const size_t chunks = std::max<size_t>(1, (bytes + slot_bytes - 1) / slot_bytes);
    ChannelCtl& ch = seg_->channel(rank_, peer);
    const auto* in = static_cast<const uint8_t*>(buf);
    for (size_t c = 0; c < chunks; ++c) {
        const uint32_t k = sent_[static_cast<size_t>(peer)];
        wait_rank(peer, &ch.received, &ch.received_waiters, k - 1, "send to",
                  true);  // slot k % 2 free: chunk k - 2 taken
        const size_t off = c * slot_bytes;
        const size_t n = std::min(slot_bytes, bytes - off);
        copy(seg_->channel_data(rank_, peer, k % 2), in + off, n);
        ch.msg_bytes[k % 2] = bytes;
        publish(ch.sent, ch.sent_waiters, k + 1);
        sent_[static_cast<size_t>(peer)] = k + 1;
    }
}

void ShmCommunicator::recv(void* buf, size_t count, DType dtype, int peer) {
    check_usable();
    PG_CHECK(peer >= 0 && peer < size_ && peer != rank_, "recv from rank ", peer, " on rank ", rank_, " of ", size_);
    const size_t bytes = count * comm_element_size(dtype);
    const size_t slot_bytes = seg_->layout.channel_bytes / 2;
    const size_t chunks = std::max<size_t>(1, (bytes + slot_bytes - 1) / slot_bytes);
    ChannelCtl& ch = seg_->channel(peer, rank_);
    auto* out = static_cast<uint8_t*>(buf);
    for (size_t c = 0; c < chunks; ++c) {
        const uint32_t k = taken_[static_cast<size_t>(peer)];
        wait_rank(peer, &ch.sent, &ch.sent_waiters, k + 1, "recv from", true);
        if (const uint64_t announced = ch.msg_bytes[k % 2]; announced != bytes)
            give_up(
                str_cat("rank ", peer, " sent a message of ", announced, " bytes, rank ", rank_, " expected ", bytes));
        const size_t off = c * slot_bytes;
        const size_t n = std::min(slot_bytes, bytes - off);
        copy(out + off, seg_->channel_data(peer, rank_, k % 2), n);
        publish(ch.received, ch.received_waiters, k + 1);
        taken_[static_cast<size_t>(peer)] = k + 1;
    }
}

}  // namespace peregrine
