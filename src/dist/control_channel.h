// Rank 0's commands to the other ranks of its group: each step's batch, block copies, stop.
// Rank 0 runs the scheduler; every other rank only runs what it is sent, in order. This is a
// channel of its own, on TCP, apart from the collectives: it crosses hosts whatever the
// backend (NCCL moves device memory only; the CPU communicator is one host's shared memory).
//
// Rank 0 listens on an ephemeral port of every interface and publishes it in the group's
// rendezvous store ("control/port"); rank r connects to the store's host at that port and says
// its rank (u32). Then rank 0 writes messages [u32 length][bytes] (little-endian) to every
// rank; the others never write again, so anything readable on rank 0's side of a connection is
// its end: the rank is gone.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace peregrine {

class TcpStore;

class ControlLeader {
  public:
    // Accepts ranks 1 .. store.world_size() - 1 within `timeout`; fails early, naming the rank,
    // when the store sees one of them disconnect first.
    ControlLeader(TcpStore& store, std::chrono::milliseconds timeout);
    ~ControlLeader();  // closes every connection: the other ranks' recv returns false
    ControlLeader(const ControlLeader&) = delete;
    ControlLeader& operator=(const ControlLeader&) = delete;

    // `message` to every other rank; throws Error naming the first rank whose connection broke.
    void send(const std::string& message);
    // The first rank whose connection has closed (without waiting), or -1.
    int closed_rank() const;

  private:
    std::vector<int> fds_;  // [world size], fds_[0] unused (-1)
};

class ControlFollower {
  public:
    // Connects to rank 0's channel (its port read from `store`) at `master_addr`.
    ControlFollower(TcpStore& store, const std::string& master_addr, std::chrono::milliseconds timeout);
    ~ControlFollower();
    ControlFollower(const ControlFollower&) = delete;
    ControlFollower& operator=(const ControlFollower&) = delete;

    // Blocks for the next message; false when rank 0 closed the channel (or went away).
    bool recv(std::string& message);

  private:
    int fd_ = -1;
};

}  // namespace peregrine
