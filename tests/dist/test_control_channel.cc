// Rank 0's control channel (src/dist/control_channel.h) over 127.0.0.1: ranks are threads of
// this process with their own store connection, or a forked process where a rank must die.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/control_channel.h"
#include "dist/socket_io.h"
#include "dist/tcp_store.h"

namespace peregrine {
namespace {

using std::chrono::milliseconds;

TcpStore::Options options(int rank, int world, int port) {
    TcpStore::Options o;
    o.master_port = port;
    o.rank = rank;
    o.world_size = world;
    o.timeout = milliseconds(10000);
    return o;
}

TEST(ControlChannel, EveryRankGetsEveryMessageInOrder) {
    const int world = 4;
    TcpStore store0(options(0, world, 0));
    std::vector<std::future<std::vector<std::string>>> ranks;
    for (int r = 1; r < world; ++r)
        ranks.push_back(std::async(std::launch::async, [r, port = store0.port()] {
            TcpStore store(options(r, world, port));
            ControlFollower follower(store, "127.0.0.1", milliseconds(10000));
            std::vector<std::string> got;
            std::string m;
            while (follower.recv(m)) got.push_back(m);
            return got;
        }));
    std::vector<std::string> sent = {"a", "", std::string(3 << 20, 'x'), std::string("\0\1\2", 3)};
    {
        ControlLeader leader(store0, milliseconds(10000));
        EXPECT_EQ(leader.closed_rank(), -1);
        for (const std::string& m : sent) leader.send(m);
    }  // closing: every follower's recv returns false
    for (auto& f : ranks) EXPECT_EQ(f.get(), sent);
}

TEST(ControlChannel, LeaderSeesARankThatDied) {
    TcpStore store0(options(0, 2, 0));
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        try {
            TcpStore store(options(1, 2, store0.port()));
            ControlFollower follower(store, "127.0.0.1", milliseconds(10000));
            std::string m;
            follower.recv(m);  // "go"
        } catch (...) {
        }
        ::_exit(0);  // no goodbye, connections dropped
    }
    ControlLeader leader(store0, milliseconds(10000));
    leader.send("go");
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    for (int i = 0; i < 100 && leader.closed_rank() < 0; ++i) std::this_thread::sleep_for(milliseconds(10));
    EXPECT_EQ(leader.closed_rank(), 1);
    try {
        for (int i = 0; i < 100; ++i) leader.send(std::string(1 << 16, 'y'));  // until the kernel says so
        FAIL() << "sending to a dead rank succeeded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
}

TEST(ControlChannel, StrangersAreDroppedAndAMissingRankTimesOut) {
    // Rank 2 only reads the channel's port from the store (a store is one thread's); ranks 1 and
    // 2 never connect to the channel.
    TcpStore store0(options(0, 3, 0));
    auto leader = std::async(std::launch::async, [&] { ControlLeader l(store0, milliseconds(600)); });
    const int port = std::stoi(TcpStore(options(2, 3, store0.port())).get("control/port"));
    // Not one of ours: no hello, then a bad rank; neither takes rank 1's place.
    const int a = connect_with_retry("127.0.0.1", port, milliseconds(2000), "test");
    ::close(a);
    const int b = connect_with_retry("127.0.0.1", port, milliseconds(2000), "test");
    std::string hello;
    put_u32(hello, 7);
    send_all(b, hello);
    try {
        leader.get();
        FAIL() << "the leader accepted a stranger";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 did not connect"), std::string::npos) << e.what();
    }
    ::close(b);
}

}  // namespace
}  // namespace peregrine
