// The CPU communicator: collectives between the processes of one host through one POSIX
// shared-memory segment per group (used by the CPU backend's tensor / pipeline parallel ranks
// and by the tests of everything above it).
//
// Rendezvous. `create(group, rank, size)` is called once by each of the `size` processes.
// Rank 0 removes any segment left by a crashed earlier run of the same group, creates
// /dev/shm/peregrine-<group>, sizes it (reserving the memory, so a full /dev/shm is an Error,
// not a SIGBUS later), writes the header and marks it ready. The other ranks open it by name
// (retrying until it appears and is ready; a ready segment whose rank 0 process is gone is
// stale and skipped), claim their slot with their pid and wait until every rank has joined.
// Rank 0 then unlinks the name: the segment lives on while mapped and vanishes with the last
// process, so nothing is left behind whatever happens afterwards. Rendezvous past `timeout_s`
// throws Error naming the ranks that never came.
//
// Segment layout (byte offsets; slots_off = 4096, channels_off = slots_off + size * 192,
// staging_off and chan_data_off rounded up to 4096; counters sit on their own 64-byte lines):
//
//   [0, 4096)          Header: magic "PGSHMCM1", version, state (0 sizing, 1 ready,
//                      2 started = all joined), number of ranks, staging and channel bytes,
//                      total bytes, `aborted` (0, or 1 + the rank that gave up first) and that
//                      rank's message (NUL-terminated, at most 511 bytes).
//   slots_off          RankSlot [size], 192 bytes each: pid, start time (clock ticks since
//                      boot, /proc/<pid>/stat field 22, so a reused pid is not mistaken for
//                      the rank), joined, left, the collective phase counter (+ its waiter
//                      count, for the futex) and the descriptors of the last two collectives.
//   channels_off       ChannelCtl [size * (size - 1)], 192 bytes each, one per ordered pair
//                      src != dst at index src * (size - 1) + (dst < src ? dst : dst - 1): the
//                      point-to-point counters `sent` (chunks written by src) and `received`
//                      (chunks taken by dst), each with a waiter count, and the message bytes
//                      announced in each of the two chunk slots.
//   staging_off        Collective staging, staging_bytes per rank (rank r at
//                      staging_off + r * staging_bytes), used as two halves of
//                      staging_bytes / 2 (double buffering: round t uses half t % 2).
//   chan_data_off      Point-to-point data, channel_bytes = staging_bytes / 2 per ordered pair
//                      (same index), two chunk slots of channel_bytes / 2.
//   total              = chan_data_off + size * (size - 1) * channel_bytes, rounded up to 4096.
//
// Collectives. Every collective is a series of rounds, one per chunk of up to staging_bytes / 2
// bytes per rank (at least one round, even for count 0, so every collective also
// synchronises). A round is one or two phases; a phase is "store my phase counter, then wait
// until every rank's counter reaches it". Since a rank publishes the first phase of round t only
// after its last read of round t - 1, and writes its half t % 2 only after seeing every rank in
// round t - 1, a staging half is never overwritten while someone still reads it.
//   all_reduce_sum: copy my chunk into my half; phase; reduce slice r of the chunk (elements
//     [n r / size, n (r + 1) / size)) over ranks 0, 1, ... in that order, in f32, into my own
//     half (bf16 rounded to nearest even once, at the end); phase; copy every rank's slice out.
//     Each element is computed by one rank, so all ranks get the same bits, equal to a serial
//     left-to-right sum of the ranks' buffers.
//   all_gather: copy my chunk in; phase; copy every rank's chunk out.
//   broadcast: root copies its chunk in; phase; the others copy it out.
//   barrier: one phase.
// The first phase of each collective also publishes a descriptor (op, dtype, count, root); a
// rank that finds another rank in a different collective throws Error naming both.
//
// Point to point. Each ordered pair has its own channel of two chunk slots, independent of the
// collectives: send copies chunk k into slot k % 2 once the receiver has taken chunk k - 2, and
// announces the message's byte count with it; recv checks that count against its own. A send
// returns once its last chunk is in the channel (up to channel_bytes buffered); larger
// messages wait for the receiver, so do not rely on buffering to order sends before recvs.
//
// Waiting and liveness. A waiter spins briefly, then sleeps on a futex in the segment in slices
// of at most 10 ms; after each slice it checks the group's `aborted` word, whether the awaited
// rank left or its process exited (by /proc/<pid>/stat: gone, zombie or a different start
// time), and the deadline (timeout_s per wait; <= 0 waits for ever but still notices exits).
// Any of those throws Error naming the rank ("rank 1 (pid 1234) exited", "rank 1 did not answer
// within 10 s") and first sets `aborted`, so the other ranks stop too rather than time out one
// by one. After an Error the communicator is broken: every later call throws the same Error.
//
// One thread per rank uses a communicator (it is not thread safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace peregrine {

class ShmCommunicator : public Communicator {
  public:
    // Collective staging per rank (two halves of 1 MiB); point to point gets half as much per
    // ordered pair. A group of 4 ranks then maps 8 + 12 MiB, one of 8 ranks 16 + 56 MiB.
    static constexpr size_t kDefaultStagingBytes = size_t{2} << 20;

    // Joins (rank 0: creates) the group `group` of `size` ranks; `group` names the segment, so
    // it must be unique among concurrently running groups of this host and contain no '/'.
    // Throws Error when the rendezvous does not complete within timeout_s seconds.
    // `staging_bytes` (a multiple of 256, >= 1024) must be the same on every rank.
    static std::unique_ptr<ShmCommunicator> create(const std::string& group, int rank, int size, double timeout_s = 10,
                                                   size_t staging_bytes = kDefaultStagingBytes);

    ~ShmCommunicator() override;
    std::string name() const override;

    void all_reduce_sum(void* buf, size_t count, DType dtype) override;
    void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
    void broadcast(void* buf, size_t count, DType dtype, int root) override;
    void send(const void* buf, size_t count, DType dtype, int peer) override;
    void recv(void* buf, size_t count, DType dtype, int peer) override;
    void barrier() override;

    // Seconds a wait on a peer may take before it throws; <= 0: no limit (exits of peers are
    // still noticed). A worker idling for its next batch wants no limit.
    void set_timeout(double timeout_s) { timeout_s_ = timeout_s; }
    double timeout() const { return timeout_s_; }

    // The pid each rank published at the rendezvous, [size()].
    const std::vector<int>& pids() const { return pids_; }

  private:
    struct Segment;  // the mapped segment's typed views (shm_communicator.cc)

    ShmCommunicator(std::string group, int rank, int size, double timeout_s);

    // One phase of a collective: publish my next phase number and wait until every rank has
    // published it. `what` names the collective for messages.
    void phase(const char* what);
    // Publishes my descriptor of this collective, runs the first phase, then checks the others'.
    void begin_collective(uint32_t op, DType dtype, size_t count, int root, const char* what);
    // Waits until the shared `counter` of rank `peer` reaches `target` (sleeping on it with
    // `waiters` counted), checking the group's abort word, the peer's liveness and the deadline.
    // `what` names the operation in messages, followed by " rank <peer>" when `names_peer`
    // (send / recv: the text is built only when a message is).
    void wait_rank(int peer, uint32_t* counter, uint32_t* waiters, uint32_t target, const char* what,
                   bool names_peer = false);
    [[noreturn]] void give_up(const std::string& message);
    void check_usable() const;

    std::string group_;
    double timeout_s_;
    std::vector<int> pids_;              // [size]
    std::vector<uint64_t> start_times_;  // [size], clock ticks since boot
    std::unique_ptr<Segment> seg_;
    uint32_t phase_ = 0;            // my phase counter (the value last published)
    uint32_t num_collectives_ = 0;  // collectives begun, picks the descriptor slot
    uint64_t round_ = 0;            // collective rounds done, picks the staging half
    std::vector<uint32_t> sent_;    // [size] chunks sent to each peer
    std::vector<uint32_t> taken_;   // [size] chunks received from each peer
    std::string broken_;            // non-empty after an Error: the message every call repeats
};

}  // namespace peregrine
