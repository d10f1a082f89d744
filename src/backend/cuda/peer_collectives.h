// Small collectives between the GPUs of one host through peer memory (NVLink, or PCIe P2P):
// one kernel a call, for the messages of a decode step that NCCL serves slowly.
//
// Why: a decode step of the Llama 8B at batch 1 and tensor parallelism 2 makes two all-reduces
// a layer of 16 KB each (64 a token), plus one for the embedding and one all-gather of the
// logits. NCCL costs ~10-30 us for such a message inside our CUDA graphs, a large share of a
// ~3 ms token; a single pass of NVLink writes costs a few microseconds (vLLM's and
// TensorRT-LLM's custom all-reduce do the same).
//
// How (push, then one barrier): every rank owns a staging area of 2 parities x R slots x
// kSlotBytes and a flag area, mapped into the other ranks by CUDA IPC handles. Each of the
// kernel's kBlocks CTAs writes its share of this rank's input into slot `rank` of every rank's
// staging (parity = the call's epoch & 1; remote writes over NVLink, no reads across the link),
// then stores the epoch into its own flag of every peer (release, system scope) and waits until
// every peer's CTA of the same index has stored the epoch into this rank's flags (acquire).
// The CTA then reads its share of all R slots from local memory: the sum in rank order (all-
// reduce) or the slots side by side (all-gather). Every CTA runs in every call and every rank
// makes the same calls, so the epochs agree; a rank can be one call ahead of a peer that is
// still reading, and then writes the other parity. Each element is summed in the same order on
// every rank, so all ranks end with the same bits: the f32 rank-order sum of the Communicator
// contract, unlike NCCL's ring-ordered ones.
//
// The kernels are launched with programmatic dependent launch (pdl.cuh): the next kernel of
// the step may start streaming its weights while a call waits for its peers. A CTA waiting for
// a peer that never arrives (a dead rank) traps after 30 s, so the step fails with an error
// instead of hanging the GPU; the rank group's watcher names the rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

typedef struct CUstream_st* cudaStream_t;  // as cuda_runtime.h has it

namespace peregrine::cuda {

class PeerCollectives {
  public:
    static constexpr int kMaxRanks = 8;
    static constexpr int kBlocks = 32;                     // CTAs of every call
    static constexpr size_t kSlotBytes = size_t(1) << 20;  // f32 bytes of one rank's message, at most

    // This rank's half of the setup: allocates and zeroes the staging area and flags on
    // `device` (current on the calling thread). handle() is then given to the other ranks.
    PeerCollectives(int rank, int size, int device);
    ~PeerCollectives();
    PeerCollectives(const PeerCollectives&) = delete;
    PeerCollectives& operator=(const PeerCollectives&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    // "device:hex(cudaIpcMemHandle_t)": what the other ranks open.
    std::string handle() const;
    // The device ordinal a handle() names.
    static int handle_device(const std::string& handle);
    // Whether this GPU can write `peer_device`'s memory directly (cudaDeviceCanAccessPeer).
    bool can_reach(int peer_device) const;
    // Maps every other rank's staging area from `handles` (rank order, this rank's included).
    // Throws Error naming the rank whose handle fails.
    void open(const std::vector<std::string>& handles);

    // Whether a call with `count` f32 elements a rank runs here (open, count a multiple of 4,
    // at most kSlotBytes). A function of count alone, so every rank of the group decides alike.
    bool fits(size_t count) const;

    // On `stream`, every rank calling with the same count in the same order as its other
    // collectives; buffers are this rank's device memory, 16-byte aligned:
    // out[i] += sum over ranks r (rank order) of x_r[i], i < count.
    void reduce_add(const float* x, float* out, size_t count, cudaStream_t stream);
    // buf[i] = sum over ranks r (rank order) of buf_r[i], in place.
    void all_reduce(float* buf, size_t count, cudaStream_t stream);
    // recv[r * count + i] = send_r[i] for every rank r.
    void all_gather(const float* send, float* recv, size_t count, cudaStream_t stream);

  private:
    void launch(int mode, const float* x, float* out, size_t count, cudaStream_t stream);

    int rank_, size_, device_;
    void* local_ = nullptr;       // staging [2][size_][kSlotBytes] then flags [kBlocks][kMaxRanks]
    uint32_t* epochs_ = nullptr;  // [kBlocks], this rank only: calls made, per CTA
    std::vector<void*> peers_;    // every rank's staging area as mapped here; empty until open
};

}  // namespace peregrine::cuda
