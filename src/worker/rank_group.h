// This process's place in a model-parallel group of tensor_parallel_size x
// pipeline_parallel_size ranks, one process each (rank g: tensor-parallel rank g % T of
// pipeline stage g / T).
//
// Hosts. The launch (dist/launch_env.h: flags, PEREGRINE_*, mpirun, PMI, Slurm, a
// LeaderWorkerSet) starts one process per host, N hosts; each holds K = T * P / N consecutive
// ranks: host n's launched process is rank n K and forks ranks n K + 1 .. n K + K - 1 itself
// (children that die with it). Rank 0 also runs the scheduler and the API; the others run what
// it sends them (worker/parallel_executor.h).
//
// Joining: every rank connects to rank 0's rendezvous store (dist/tcp_store.h), checks that all
// loaded the same model with the same options, publishes where it runs, and joins its
// communicators: on the CPU one shared-memory group per stage (tensor parallel) and one per
// tensor-parallel column (pipeline parallel; the column of rank 0 also carries the last stage's
// logits back to rank 0). Then rank 0 opens the control channel and every other rank connects.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "model/model.h"
#include "model/model_config.h"
#include "peregrine/engine_config.h"

namespace peregrine {

class Backend;
class ControlFollower;
class ControlLeader;
class TcpStore;

class RankGroup {
  public:
    // Joins this process's group. `config.parallel_size()` must be > 1. Forks this host's other
    // ranks first, before anything else starts a thread: call it early (the CLI does, before
    // the HTTP server). Throws Error naming the rank, flag or variable on any failure.
    static std::unique_ptr<RankGroup> join(const EngineConfig& config);
    ~RankGroup();
    RankGroup(const RankGroup&) = delete;
    RankGroup& operator=(const RankGroup&) = delete;

    int rank() const { return rank_; }
    int size() const { return tp_size_ * pp_size_; }
    TensorParallel tp() const { return {rank_ % tp_size_, tp_size_}; }
    int stage() const { return rank_ / tp_size_; }
    int stages() const { return pp_size_; }
    bool last_stage() const { return stage() == pp_size_ - 1; }
    // The communicators over `backend`: the shared-memory ones joined at start (CPU), or NCCL
    // groups joined on the backend's stream and GPU (CUDA). Once per process.
    ModelParallel connect(Backend& backend);
    ModelParallel comms() const { return {tp_comm_.get(), pp_comm_.get()}; }
    int device_index() const { return device_index_; }
    // The config this rank's worker uses: `threads` is this rank's share of the host's cores.
    const EngineConfig& config() const { return config_; }
    // "tensor parallel 2 x pipeline parallel 1: 2 ranks, 1 launched process on 1 host (...)".
    std::string describe() const;

    // The smallest `value` over the ranks (the KV blocks that fit on every rank); every rank
    // calls it with the same `key`.
    int agree_min(const std::string& key, int value);
    // The sum of `value` over the ranks (a KV block's bytes over every rank's slice), likewise.
    int64_t agree_sum(const std::string& key, int64_t value);

    // Rank 0: `message` to every other rank, in order. Others: the next message from rank 0;
    // false once rank 0 stopped or went away.
    void send_step(const std::string& message);
    bool recv_step(std::string& message);

    // Rank 0: watches every other rank from a thread, every 50 ms: a rank whose process ended,
    // whose store or control connection closed, calls `on_failure` with a message naming it
    // ("rank 1 (pid 4242 on host-a) exited: killed by signal 9"). stop_watching() before a
    // clean stop. The default failure handler prints the message and ends the process (1).
    void watch(std::function<void(const std::string&)> on_failure);
    void stop_watching();
    // After a collective failed with `error`: the message naming the rank that ended (waiting up
    // to 1 s for its process or connections to show it; stops the watcher), else `error`.
    std::string diagnose(const std::string& error);
    [[noreturn]] static void exit_group(const std::string& message);

    // Waits up to `seconds` for this host's forked ranks to exit, then kills those left.
    void reap_children(double seconds);

  private:
    // Every rank's `value` through the store under `key`, folded by rank 0 with `op` in rank order.
    int64_t agree(const std::string& key, int64_t value, int64_t (*op)(int64_t, int64_t));
    RankGroup() = default;
    std::string who(int rank) const;  // "rank 1 (pid 4242 on host-a)"
    std::string failure();            // "" while every rank is there
    std::string reaped_child();       // a forked rank that has exited, with its status; or ""
    void open_control(const std::string& master_addr);

    EngineConfig config_;
    int rank_ = 0;
    int tp_size_ = 1, pp_size_ = 1;
    int launched_ = 1;  // processes the launcher started (one per host, or mpirun's -np)
    int hosts_ = 0;     // distinct hosts among the ranks
    bool cuda_ = false;
    int device_index_ = 0;            // this rank's GPU on its host
    std::vector<pid_t> children_;     // forked ranks of this host (indexed by local index - 1)
    std::vector<int> child_ranks_;    // their ranks
    std::vector<std::string> where_;  // [size] "pid on host" of every rank
    std::unique_ptr<TcpStore> store_;
    std::unique_ptr<Communicator> tp_comm_, pp_comm_;
    std::unique_ptr<ControlLeader> leader_;
    std::unique_ptr<ControlFollower> follower_;
    std::thread watcher_;
    std::atomic<bool> watching_{false};
};

}  // namespace peregrine
