// The rendezvous store (src/dist/tcp_store.h) over 127.0.0.1 with an ephemeral port: ranks are
// threads of this process, or a forked process where a rank must die without saying goodbye.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/tcp_store.h"

namespace peregrine {
namespace {

using std::chrono::milliseconds;

TcpStore::Options options(int rank, int world, int port, milliseconds timeout = milliseconds(10000)) {
    TcpStore::Options o;
    o.master_addr = "127.0.0.1";
    o.master_port = port;
    o.rank = rank;
    o.world_size = world;
    o.timeout = timeout;
    return o;
}

// Runs fn on a thread; the future rethrows what it threw.
template <typename F>
std::future<void> on_thread(F fn) {
    return std::async(std::launch::async, std::move(fn));
}

std::string error_of(std::future<void>& f) {
    try {
        f.get();
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

TEST(TcpStore, SetAndWaitingGetAcrossRanks) {
    TcpStore rank0(options(0, 3, 0));
    const int port = rank0.port();
    ASSERT_GT(port, 0);
    const std::string binary("id\0with\xff bytes", 15);
    std::promise<void> waiting;
    auto r2 = on_thread([&] {
        TcpStore s(options(2, 3, port));
        waiting.set_value();
        EXPECT_EQ(s.get("nccl_id"), binary);  // blocks until rank 1 sets it
        EXPECT_EQ(s.get("early"), "from rank 0");
    });
    rank0.set("early", "from rank 0");
    waiting.get_future().wait();
    std::this_thread::sleep_for(milliseconds(50));
    auto r1 = on_thread([&] {
        TcpStore s(options(1, 3, port));
        s.set("nccl_id", binary);
        s.set("nccl_id", binary);  // setting again is allowed (last value wins)
    });
    r1.get();
    r2.get();
    EXPECT_EQ(rank0.get("nccl_id"), binary);
    EXPECT_EQ(rank0.failure(), "");
}

TEST(TcpStore, FingerprintsMatch) {
    TcpStore rank0(options(0, 3, 0));
    const int port = rank0.port();
    std::vector<std::future<void>> ranks;
    for (int r = 1; r < 3; ++r)
        ranks.push_back(on_thread([r, port] {
            TcpStore s(options(r, 3, port));
            s.check_fingerprint("model=/m;tp=2");
            s.check_fingerprint("second check");  // checks can repeat
        }));
    rank0.check_fingerprint("model=/m;tp=2");
    rank0.check_fingerprint("second check");
    for (auto& f : ranks) f.get();
}

TEST(TcpStore, FingerprintMismatchFailsEveryRank) {
    TcpStore rank0(options(0, 3, 0));
    const int port = rank0.port();
    std::vector<std::future<void>> ranks;
    for (int r = 1; r < 3; ++r)
        ranks.push_back(on_thread([r, port] {
            TcpStore s(options(r, 3, port));
            s.check_fingerprint(r == 2 ? "model=/other" : "model=/m");
        }));
    ranks.push_back(on_thread([&] { rank0.check_fingerprint("model=/m"); }));
    const std::string expected =
        "rank 2 loaded a different model or options than rank 0: rank 2 has 'model=/other', rank 0 has 'model=/m'";
    for (auto& f : ranks) EXPECT_EQ(error_of(f), expected);
}

TEST(TcpStore, RankThatNeverConnectsTimesOutNamingIt) {
    TcpStore rank0(options(0, 3, 0, milliseconds(300)));
    const int port = rank0.port();
    auto r1 = on_thread([port] {
        TcpStore s(options(1, 3, port, milliseconds(300)));
        s.check_fingerprint("m");
    });
    auto r0 = on_thread([&] { rank0.check_fingerprint("m"); });
    for (auto* f : {&r0, &r1}) {
        const std::string err = error_of(*f);
        EXPECT_NE(err.find("timed out after 0.3 s waiting for key 'fingerprint/0/2'"), std::string::npos) << err;
        EXPECT_NE(err.find("ranks that never connected: 2"), std::string::npos) << err;
    }
}

TEST(TcpStore, UnreachableRankZeroTimesOut) {
    int port = 0;
    {
        TcpStore gone(options(0, 1, 0));
        port = gone.port();
    }
    auto start = std::chrono::steady_clock::now();
    try {
        TcpStore s(options(1, 2, port, milliseconds(300)));
        FAIL() << "connected to a closed port";
    } catch (const Error& e) {
        const std::string err = e.what();
        EXPECT_NE(err.find("could not reach rank 0's rendezvous store at 127.0.0.1:" + std::to_string(port) +
                           " within 0.3 s"),
                  std::string::npos)
            << err;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(TcpStore, RankThatDiesFailsWaitersNamingIt) {
    // Fork before any thread exists (the child only connects and exits); the port goes over a pipe.
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(pipe_fds[1]);
        int port = 0;
        if (::read(pipe_fds[0], &port, sizeof(port)) != sizeof(port)) ::_exit(2);
        try {
            auto* s = new TcpStore(options(1, 3, port));  // leaked on purpose: no goodbye
            (void)s;
        } catch (...) {
            ::_exit(3);
        }
        ::_exit(0);  // the kernel closes the socket, as for a crash
    }
    ::close(pipe_fds[0]);
    TcpStore rank0(options(0, 3, 0));
    const int port = rank0.port();
    ASSERT_EQ(::write(pipe_fds[1], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
    ::close(pipe_fds[1]);

    auto r2 = on_thread([port] {
        TcpStore s(options(2, 3, port));
        s.get("never set");
    });
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;

    const std::string msg =
        "rendezvous store: rank 1 disconnected from the rendezvous store without a goodbye (it exited or crashed)";
    EXPECT_EQ(error_of(r2), "rank 2: " + msg);
    try {
        rank0.get("also never set");
        FAIL() << "a wait after the failure succeeded";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), "rank 0: " + msg);
    }
    EXPECT_NE(rank0.failure().find("rank 1 disconnected"), std::string::npos);
}

TEST(TcpStore, RankZeroClosingFailsWaiters) {
    auto rank0 = std::make_unique<TcpStore>(options(0, 2, 0));
    const int port = rank0->port();
    TcpStore rank1(options(1, 2, port));
    auto waiter = on_thread([&] { rank1.get("never set"); });
    std::this_thread::sleep_for(milliseconds(100));
    rank0.reset();
    const std::string err = error_of(waiter);
    EXPECT_NE(err.find("rank 1 lost its connection to rank 0's rendezvous store"), std::string::npos) << err;
}

TEST(TcpStore, ServerRefusesBadRanks) {
    TcpStore rank0(options(0, 2, 0));
    const int port = rank0.port();
    TcpStore rank1(options(1, 2, port));
    try {
        TcpStore again(options(1, 2, port));
        FAIL() << "a second rank 1 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1 connected twice"), std::string::npos) << e.what();
    }
    try {
        TcpStore other_world(options(2, 4, port));
        FAIL() << "a rank of another world size was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 2 expects a world of 4 ranks, rank 0 one of 2"), std::string::npos)
            << e.what();
    }
    // Refused connections are not failures of the group.
    EXPECT_EQ(rank0.failure(), "");
}

TEST(TcpStore, PortInUseIsAClearError) {
    TcpStore first(options(0, 1, 0));
    try {
        TcpStore second(options(0, 1, first.port()));
        FAIL() << "two servers on one port";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot listen on port " + std::to_string(first.port())),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace peregrine
