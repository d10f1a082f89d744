// The shared-memory communicator (dist/shm_communicator.h) between real processes: each test
// forks one child per rank; a child runs the collectives, checks its own results and exits
// non-zero (after printing why) on a mismatch; the parent expects every child to exit 0.
// Results are compared bitwise with a serial reference computed in the child, and their
// hashes across ranks through a shared anonymous mapping.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "dist/shm_communicator.h"

namespace peregrine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// A group name no other test (or concurrent run of this binary) uses.
std::string unique_group(const std::string& what) {
    static int n = 0;
    return "test-" + what + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

bool segment_exists(const std::string& group) {
    return std::filesystem::exists("/dev/shm/peregrine-" + group);
}

// In a child: print and exit 1 unless `cond`.
#define CHILD_CHECK(cond, ...)                                                 \
    do {                                                                       \
        if (!(cond)) {                                                         \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #cond, \
                         ::peregrine::str_cat(__VA_ARGS__).c_str());           \
            std::fflush(stderr);                                               \
            _exit(1);                                                          \
        }                                                                      \
    } while (0)

// Memory shared by the parent and its children: [slots] 64-bit words.
struct SharedWords {
    explicit SharedWords(size_t slots) : n(slots) {
        void* p = mmap(nullptr, n * 8, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        words = p == MAP_FAILED ? nullptr : static_cast<uint64_t*>(p);
    }
    ~SharedWords() {
        if (words != nullptr) munmap(words, n * 8);
    }
    size_t n;
    uint64_t* words;
};

// Forks `size` children, child r running body(r) and exiting 0 when it returns (2 on an
// uncaught Error, 3 on anything else); returns each child's exit code (128 + signal if killed).
// `start_delay_s[r]` (optional) delays child r's start.
std::vector<int> run_ranks(int size, const std::function<void(int)>& body, std::vector<double> start_delay_s = {}) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::vector<pid_t> pids;
    for (int r = 0; r < size; ++r) {
        const pid_t pid = fork();
        if (pid == 0) {
            if (static_cast<size_t>(r) < start_delay_s.size() && start_delay_s[r] > 0)
                std::this_thread::sleep_for(std::chrono::duration<double>(start_delay_s[r]));
            try {
                body(r);
            } catch (const Error& e) {
                std::fprintf(stderr, "rank %d: uncaught Error: %s\n", r, e.what());
                std::fflush(stderr);
                _exit(2);
            } catch (...) {
                _exit(3);
            }
            std::fflush(stderr);
            _exit(0);
        }
        pids.push_back(pid);
    }
    // Reaped in rank order, so a rank that exits early stays a zombie while lower ranks run:
    // the communicator must still see it as gone.
    std::vector<int> codes;
    for (pid_t pid : pids) {
        int status = 0;
        waitpid(pid, &status, 0);
        codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    return codes;
}

void expect_all_zero(const std::vector<int>& codes) {
    for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Rank r's input element i: values of mixed signs and magnitudes (2^-10 .. 2^10), so the
// order of a sum changes its rounding.
float input_value(int r, size_t i) {
    uint64_t h = (static_cast<uint64_t>(r) + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    const float mant = static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f;  // [-0.5, 0.5)
    return std::ldexp(mant, static_cast<int>((h >> 24) % 21) - 10);
}

std::vector<float> input_f32(int r, size_t count) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = input_value(r, i);
    return v;
}

std::vector<uint16_t> input_bf16(int r, size_t count) {
    std::vector<uint16_t> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = f32_to_bf16(input_value(r, i));
    return v;
}

uint64_t fnv1a(const void* p, size_t bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// Sizes the collectives are run at: odd, around the chunk boundaries, and one (3,000,001 f32 =
// 12 MB) far larger than the default 2 MiB staging area.
const std::vector<size_t> kCounts = {1, 7, 1023, 3000001};
// With 1 KiB staging (512-byte halves: 128 f32 or 256 bf16 per round), many rounds.
constexpr size_t kSmallStaging = 1024;
const std::vector<size_t> kSmallStagingCounts = {0, 1, 7, 128, 129, 1023, 5000};

// --- all_reduce_sum ---

// Runs all-reduces of every count on `size` ranks; every rank checks its result bitwise
// against the serial left-to-right sum, and publishes its hash for the cross-rank check.
void all_reduce_case(int size, DType dtype, size_t staging, const std::vector<size_t>& counts) {
    const std::string group = unique_group("allreduce");
    SharedWords hashes(static_cast<size_t>(size) * counts.size());
    const auto codes = run_ranks(size, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, size, 10, staging);
        CHILD_CHECK(!segment_exists(group), "the segment's name outlived the rendezvous");
        for (size_t c = 0; c < counts.size(); ++c) {
            const size_t count = counts[c];
            if (dtype == DType::F32) {
                std::vector<float> buf = input_f32(rank, count);
                std::vector<float> ref = input_f32(0, count);
                for (int q = 1; q < size; ++q) {
                    const std::vector<float> in = input_f32(q, count);
                    for (size_t i = 0; i < count; ++i) ref[i] += in[i];
                }
                comm->all_reduce_sum(buf.data(), count, DType::F32);
                CHILD_CHECK(count == 0 || std::memcmp(buf.data(), ref.data(), count * 4) == 0, "f32 sum of ", count,
                            " differs from the serial sum on rank ", rank);
                hashes.words[static_cast<size_t>(rank) * counts.size() + c] = fnv1a(buf.data(), count * 4);
            } else {
                std::vector<uint16_t> buf = input_bf16(rank, count);
                std::vector<float> acc(count);
                for (int q = 0; q < size; ++q) {
                    const std::vector<uint16_t> in = input_bf16(q, count);
                    for (size_t i = 0; i < count; ++i)
                        acc[i] = q == 0 ? bf16_to_f32(in[i]) : acc[i] + bf16_to_f32(in[i]);
                }
                comm->all_reduce_sum(buf.data(), count, DType::BF16);
                for (size_t i = 0; i < count; ++i)
                    CHILD_CHECK(buf[i] == f32_to_bf16(acc[i]), "bf16 sum of ", count, " differs at ", i, " on rank ",
                                rank);
                hashes.words[static_cast<size_t>(rank) * counts.size() + c] = fnv1a(buf.data(), count * 2);
            }
        }
    });
    expect_all_zero(codes);
    for (int r = 1; r < size; ++r)
        for (size_t c = 0; c < counts.size(); ++c)
            EXPECT_EQ(hashes.words[static_cast<size_t>(r) * counts.size() + c], hashes.words[c])
                << "rank " << r << " count " << counts[c];
    EXPECT_FALSE(segment_exists(group));
}

TEST(ShmCommunicator, AllReduceF32) {
    for (int size : {2, 3, 4}) all_reduce_case(size, DType::F32, ShmCommunicator::kDefaultStagingBytes, kCounts);
}

TEST(ShmCommunicator, AllReduceBF16) {
    for (int size : {2, 3, 4}) all_reduce_case(size, DType::BF16, ShmCommunicator::kDefaultStagingBytes, kCounts);
}

TEST(ShmCommunicator, AllReduceManyRounds) {
    for (int size : {2, 3, 4}) {
        all_reduce_case(size, DType::F32, kSmallStaging, kSmallStagingCounts);
        all_reduce_case(size, DType::BF16, kSmallStaging, kSmallStagingCounts);
    }
}

TEST(ShmCommunicator, WorldOfOne) {
    const std::string group = unique_group("one");
    expect_all_zero(run_ranks(1, [&](int) {
        auto comm = ShmCommunicator::create(group, 0, 1);
        std::vector<float> buf = input_f32(0, 1023), copy = buf, out(1023);
        comm->all_reduce_sum(buf.data(), buf.size(), DType::F32);
        CHILD_CHECK(buf == copy, "all-reduce of one rank changed its buffer");
        comm->all_gather(buf.data(), out.data(), buf.size(), DType::F32);
        CHILD_CHECK(out == copy, "all-gather of one rank");
        comm->broadcast(buf.data(), buf.size(), DType::F32, 0);
        comm->barrier();
        CHILD_CHECK(comm->name() == "shm (rank 0 of 1)", comm->name());
    }));
}

// --- all_gather, broadcast ---

template <typename T>
std::vector<T> input_of(DType dtype, int r, size_t count) {
    if constexpr (sizeof(T) == 4) {
        (void)dtype;
        return input_f32(r, count);
    } else {
        return input_bf16(r, count);
    }
}

template <typename T>
void gather_and_broadcast_case(int size, DType dtype, size_t staging, const std::vector<size_t>& counts) {
    const std::string group = unique_group("gather");
    expect_all_zero(run_ranks(size, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, size, 10, staging);
        for (size_t count : counts) {
            std::vector<std::vector<T>> inputs;  // [size][count]: every rank's input
            for (int q = 0; q < size; ++q) inputs.push_back(input_of<T>(dtype, q, count));
            const std::vector<T>& mine = inputs[static_cast<size_t>(rank)];
            // all_gather: recv [size * count] = rank 0's, rank 1's, ...
            std::vector<T> got(static_cast<size_t>(size) * count), want;
            for (const auto& in : inputs) want.insert(want.end(), in.begin(), in.end());
            comm->all_gather(mine.data(), got.data(), count, dtype);
            CHILD_CHECK(got == want, "all_gather of ", count, " on rank ", rank);
            // In place: my part already sits at rank * count of the receive buffer.
            std::fill(got.begin(), got.end(), T{});
            std::copy(mine.begin(), mine.end(), got.begin() + static_cast<ptrdiff_t>(rank * count));
            comm->all_gather(got.data() + rank * count, got.data(), count, dtype);
            CHILD_CHECK(got == want, "in-place all_gather of ", count, " on rank ", rank);
            // broadcast from every root in turn (the others start from their own, different data)
            for (int root = 0; root < size; ++root) {
                std::vector<T> buf = inputs[static_cast<size_t>(rank == root ? root : (root + 1) % size)];
                comm->broadcast(buf.data(), count, dtype, root);
                CHILD_CHECK(buf == inputs[static_cast<size_t>(root)], "broadcast of ", count, " from root ", root,
                            " on rank ", rank);
            }
        }
    }));
}

TEST(ShmCommunicator, AllGatherAndBroadcastF32) {
    for (int size : {2, 3, 4})
        gather_and_broadcast_case<float>(size, DType::F32, ShmCommunicator::kDefaultStagingBytes, kCounts);
}

TEST(ShmCommunicator, AllGatherAndBroadcastBF16) {
    for (int size : {2, 3, 4})
        gather_and_broadcast_case<uint16_t>(size, DType::BF16, ShmCommunicator::kDefaultStagingBytes, kCounts);
}

TEST(ShmCommunicator, AllGatherAndBroadcastManyRounds) {
    for (int size : {2, 4}) {
        gather_and_broadcast_case<float>(size, DType::F32, kSmallStaging, kSmallStagingCounts);
        gather_and_broadcast_case<uint16_t>(size, DType::BF16, kSmallStaging, kSmallStagingCounts);
    }
}

// --- send / recv ---

TEST(ShmCommunicator, SendRecvBothDirectionsInSequence) {
    const std::string group = unique_group("p2p");
    // Several messages back to back without a recv in between (they queue in order), bigger
    // than the channel (1 MiB by default) too, then the same back the other way.
    const std::vector<size_t> counts = {1, 7, 0, 1023, 3000001, 5};
    expect_all_zero(run_ranks(2, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 2);
        const int peer = 1 - rank;
        for (int dir = 0; dir < 2; ++dir) {
            const bool sending = (rank == 0) == (dir == 0);
            for (size_t k = 0; k < counts.size(); ++k) {
                const size_t count = counts[k];
                const int tag = static_cast<int>(10 * dir + k);
                if (sending) {
                    if (k % 2 == 0) {
                        const std::vector<float> v = input_f32(tag, count);
                        comm->send(v.data(), count, DType::F32, peer);
                    } else {
                        const std::vector<uint16_t> v = input_bf16(tag, count);
                        comm->send(v.data(), count, DType::BF16, peer);
                    }
                } else if (k % 2 == 0) {
                    std::vector<float> v(count);
                    comm->recv(v.data(), count, DType::F32, peer);
                    CHILD_CHECK(v == input_f32(tag, count), "f32 message ", k, " of ", count, " dir ", dir);
                } else {
                    std::vector<uint16_t> v(count);
                    comm->recv(v.data(), count, DType::BF16, peer);
                    CHILD_CHECK(v == input_bf16(tag, count), "bf16 message ", k, " of ", count, " dir ", dir);
                }
            }
        }
        comm->barrier();
    }));
}

TEST(ShmCommunicator, SendRecvPipelineOfFour) {
    // Stage r receives from r - 1, adds 1, sends to r + 1 (a pipeline's activations), with
    // collectives interleaved on the same communicator.
    const std::string group = unique_group("pipe");
    const size_t count = 300001;
    expect_all_zero(run_ranks(4, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 4, 10, 64 * 1024);
        for (int micro = 0; micro < 3; ++micro) {
            std::vector<float> act(count);
            if (rank == 0) {
                for (size_t i = 0; i < count; ++i) act[i] = static_cast<float>(i % 1000 + micro);
            } else {
                comm->recv(act.data(), count, DType::F32, rank - 1);
                for (size_t i = 0; i < count; ++i)
                    CHILD_CHECK(act[i] == static_cast<float>(i % 1000 + micro + rank), "stage ", rank, " got ", act[i],
                                " at ", i);
            }
            for (float& x : act) x += 1;
            if (rank < 3) comm->send(act.data(), count, DType::F32, rank + 1);
            float one = 1;
            comm->all_reduce_sum(&one, 1, DType::F32);
            CHILD_CHECK(one == 4, "all-reduce between pipeline steps gave ", one);
        }
    }));
}

TEST(ShmCommunicator, RecvOfWrongSizeThrows) {
    const std::string group = unique_group("p2psize");
    SharedWords ok(2);
    const auto codes = run_ranks(2, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 2, 5);
        std::vector<float> v(8, 1.0f);
        try {
            if (rank == 0) {
                comm->send(v.data(), 7, DType::F32, 1);
            } else {
                comm->recv(v.data(), 8, DType::F32, 0);
            }
            comm->barrier();  // rank 0 learns of rank 1's failure here
        } catch (const Error& e) {
            const std::string msg = e.what();
            CHILD_CHECK(msg.find("rank 0 sent a message of 28 bytes, rank 1 expected 32") != std::string::npos, msg);
            ok.words[rank] = 1;
        }
    });
    expect_all_zero(codes);
    EXPECT_EQ(ok.words[0], 1u);
    EXPECT_EQ(ok.words[1], 1u);
}

// --- barrier ---

TEST(ShmCommunicator, BarrierWaitsForEveryRank) {
    const std::string group = unique_group("barrier");
    SharedWords arrived(4);
    expect_all_zero(run_ranks(4, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 4);
        auto* a = arrived.words;
        for (uint64_t it = 1; it <= 200; ++it) {
            if (it == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30 * rank));  // arrive staggered
            std::atomic_ref<uint64_t>(a[rank]).store(it);
            comm->barrier();
            for (int q = 0; q < 4; ++q)
                CHILD_CHECK(std::atomic_ref<uint64_t>(a[q]).load() >= it, "rank ", q, " had not reached barrier ", it);
        }
    }));
}

TEST(ShmCommunicator, MismatchedCollectivesThrow) {
    const std::string group = unique_group("mismatch");
    expect_all_zero(run_ranks(3, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 3, 5);
        std::vector<float> v(8);
        bool threw = false;
        try {
            if (rank == 1) {
                comm->all_reduce_sum(v.data(), 8, DType::F32);
            } else {
                comm->all_reduce_sum(v.data(), 7, DType::F32);
            }
        } catch (const Error& e) {
            threw = true;
            const std::string msg = e.what();
            CHILD_CHECK(msg.find("collectives out of step") != std::string::npos, msg);
            CHILD_CHECK(msg.find("all_reduce_sum(count 8, bf16)") != std::string::npos ||
                            msg.find("all_reduce_sum(count 8, f32)") != std::string::npos,
                        msg);
        }
        CHILD_CHECK(threw, "rank ", rank, " did not notice the mismatch");
    }));
}

// --- failures: a rank exits, stops answering, leaves, or never comes ---

TEST(ShmCommunicator, RankThatExitsMakesTheOthersThrow) {
    const std::string group = unique_group("exit");
    SharedWords pid_of_1(1);
    const auto codes = run_ranks(3, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 3, 2);
        std::vector<float> v(1023, 1.0f);
        comm->all_reduce_sum(v.data(), v.size(), DType::F32);  // one that works first
        if (rank == 1) {
            pid_of_1.words[0] = static_cast<uint64_t>(getpid());
            _exit(0);  // leaves without a word (and stays a zombie until the parent reaps it)
        }
        const auto t0 = Clock::now();
        try {
            comm->all_reduce_sum(v.data(), v.size(), DType::F32);
            CHILD_CHECK(false, "all_reduce_sum returned without rank 1");
        } catch (const Error& e) {
            const std::string msg = e.what();
            const std::string want = str_cat("rank 1 (pid ", comm->pids()[1], ") exited");
            CHILD_CHECK(msg.find(want) != std::string::npos, "rank ", rank, ": '", msg, "' lacks '", want, "'");
            CHILD_CHECK(seconds_since(t0) < 1.0, "took ", seconds_since(t0), " s to notice");
        }
        // The communicator stays broken.
        try {
            comm->barrier();
            CHILD_CHECK(false, "a broken communicator ran a barrier");
        } catch (const Error&) {
        }
    });
    expect_all_zero(codes);
}

TEST(ShmCommunicator, RankKilledDuringRecvMakesThePeerThrow) {
    const std::string group = unique_group("kill");
    const auto codes = run_ranks(2, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 2, 2);
        if (rank == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            raise(SIGKILL);
        }
        std::vector<float> v(4096);
        const auto t0 = Clock::now();
        try {
            comm->recv(v.data(), v.size(), DType::F32, 1);
            CHILD_CHECK(false, "recv returned from a killed rank");
        } catch (const Error& e) {
            const std::string msg = e.what();
            CHILD_CHECK(msg.find(str_cat("rank 1 (pid ", comm->pids()[1], ") exited")) != std::string::npos, msg);
            CHILD_CHECK(msg.find("recv from rank 1") != std::string::npos, msg);
            CHILD_CHECK(seconds_since(t0) < 1.0, "took ", seconds_since(t0), " s");
        }
    });
    EXPECT_EQ(codes[0], 0);
    EXPECT_EQ(codes[1], 128 + SIGKILL);
}

TEST(ShmCommunicator, RankThatStopsAnsweringTimesOut) {
    const std::string group = unique_group("silent");
    const auto codes = run_ranks(2, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 2, 0.5);
        if (rank == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(800));  // alive, but not in the barrier
            return;
        }
        const auto t0 = Clock::now();
        try {
            comm->barrier();
            CHILD_CHECK(false, "barrier returned without rank 1");
        } catch (const Error& e) {
            const std::string msg = e.what();
            CHILD_CHECK(msg.find("rank 1 did not answer within 0.5 s") != std::string::npos, msg);
            const double took = seconds_since(t0);
            CHILD_CHECK(took >= 0.45 && took < 1.2, "timed out after ", took, " s");
        }
    });
    expect_all_zero(codes);
}

TEST(ShmCommunicator, RankThatLeavesMakesTheOthersThrow) {
    const std::string group = unique_group("leave");
    const auto codes = run_ranks(2, [&](int rank) {
        auto comm = ShmCommunicator::create(group, rank, 2, 0);  // no deadline: only the leave ends the wait
        if (rank == 1) {
            comm.reset();  // the process lives on, the communicator is gone
            std::this_thread::sleep_for(std::chrono::milliseconds(600));  // then exits: "left" must come first
            return;
        }
        const auto t0 = Clock::now();
        try {
            comm->barrier();
            CHILD_CHECK(false, "barrier returned without rank 1");
        } catch (const Error& e) {
            const std::string msg = e.what();
            CHILD_CHECK(
                msg.find("rank 1 (pid ") != std::string::npos && msg.find("left the group") != std::string::npos, msg);
            CHILD_CHECK(seconds_since(t0) < 0.55, "took ", seconds_since(t0), " s");
        }
    });
    expect_all_zero(codes);
}

TEST(ShmCommunicator, RendezvousWithAMissingRankTimesOut) {
    // Ranks 0 and 1 of 3 come, rank 2 never does.
    const std::string group = unique_group("missing");
    const auto codes = run_ranks(2, [&](int rank) {
        const auto t0 = Clock::now();
        try {
            ShmCommunicator::create(group, rank, 3, 0.5);
            CHILD_CHECK(false, "the rendezvous completed without rank 2");
        } catch (const Error& e) {
            const std::string msg = e.what();
            CHILD_CHECK(msg.find("rendezvous timed out after 0.5 s: rank 2 never joined") != std::string::npos, msg);
            CHILD_CHECK(seconds_since(t0) < 1.5, "took ", seconds_since(t0), " s");
        }
    });
    expect_all_zero(codes);
    EXPECT_FALSE(segment_exists(group));

    // A lone rank 1: rank 0 never creates the segment.
    const std::string lone = unique_group("lone");
    expect_all_zero(run_ranks(1, [&](int) {
        try {
            ShmCommunicator::create(lone, 1, 2, 0.3);
            CHILD_CHECK(false, "the rendezvous completed without rank 0");
        } catch (const Error& e) {
            const std::string msg = e.what();
            CHILD_CHECK(msg.find("rendezvous timed out after 0.3 s: rank 0 never created") != std::string::npos, msg);
        }
    }));
}

TEST(ShmCommunicator, StaleSegmentOfACrashedRunIsReplaced) {
    const std::string group = unique_group("stale");
    // A rank 0 that creates the segment and is killed while waiting for rank 1.
    const pid_t crashed = fork();
    if (crashed == 0) {
        try {
            ShmCommunicator::create(group, 0, 2, 30);
        } catch (...) {
        }
        _exit(0);
    }
    const auto t0 = Clock::now();
    while (!segment_exists(group) && seconds_since(t0) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past sizing: marked ready
    kill(crashed, SIGKILL);
    int status = 0;
    waitpid(crashed, &status, 0);
    ASSERT_TRUE(segment_exists(group)) << "the crashed rank 0 should have left its segment";

    // The new run: rank 1 comes first and finds the stale segment, rank 0 replaces it later.
    expect_all_zero(run_ranks(2,
                              [&](int rank) {
                                  auto comm = ShmCommunicator::create(group, rank, 2, 5);
                                  float x = static_cast<float>(rank + 1);
                                  comm->all_reduce_sum(&x, 1, DType::F32);
                                  CHILD_CHECK(x == 3.0f, "sum ", x);
                              },
                              {0.2, 0.0}));
    EXPECT_FALSE(segment_exists(group));
}

TEST(ShmCommunicator, BadArgumentsThrow) {
    EXPECT_THROW(ShmCommunicator::create("a/b", 0, 2, 0.1), Error);
    EXPECT_THROW(ShmCommunicator::create("", 0, 2, 0.1), Error);
    EXPECT_THROW(ShmCommunicator::create("x", 2, 2, 0.1), Error);
    EXPECT_THROW(ShmCommunicator::create("x", 0, 2, 0.1, 1000), Error);
}

}  // namespace
}  // namespace peregrine
