// The Communicator on NVIDIA GPUs: NCCL collectives between one process per GPU.
//
// NCCL (libnccl.so.2) and the CUDA driver (libcuda.so.1) are loaded at run time with dlopen, so
// nothing links against them: builds without CUDA compile this file, and the GPU bundle does not
// carry NCCL (the machine's does). The few NCCL types and entry points used are declared in the
// .cc with nccl.h's ABI.
//
// Every op is enqueued on the stream given at creation (the backend's step stream), so a step
// recorded into a CUDA graph captures its collectives; the host returns as soon as the op is
// queued. Buffers are device pointers on this rank's GPU.
//
// Numerics differ from the interface's CPU contract in one way: NCCL sums bf16 in its own order
// (ring or tree, with bf16 partial sums), not in rank order in f32. Every rank still ends with the
// same bits, since each reduced element is computed once and copied to all.
#pragma once

#include <array>
#include <deque>
#include <memory>
#include <string>
#include <string_view>

#include "dist/communicator.h"

namespace peregrine {

struct NcclLibrary;

// ncclUniqueId: 128 opaque bytes made by rank 0 (new_id) and handed to the others through the
// rendezvous store (as bytes(): a 128-byte string).
struct NcclId {
    std::array<char, 128> data{};

    std::string bytes() const { return std::string(data.data(), data.size()); }
    // Throws Error unless `bytes` is exactly 128 bytes.
    static NcclId from_bytes(std::string_view bytes);
};

class NcclCommunicator final : public Communicator {
  public:
    // True when libnccl.so.2 and libcuda.so.1 load; otherwise false and `why` says which did not.
    static bool available(std::string* why = nullptr);

    // A fresh id for a new group (ncclGetUniqueId); rank 0 calls it once and shares the result.
    static NcclId new_id();

    // Joins the group (ncclCommInitRank: returns once all `size` ranks joined, with no timeout of
    // its own, so call it after the rendezvous store has seen every rank). Makes `device`'s
    // primary context current on the calling thread, the one the CUDA runtime uses for that device.
    // `stream` is a cudaStream_t (CUstream) of that device; nullptr means the legacy default
    // stream. Throws Error naming the call on any failure, or "NCCL not found (libnccl.so.2): ..."
    // when NCCL is missing.
    static std::unique_ptr<NcclCommunicator> create(const NcclId& id, int rank, int size, int device, void* stream);
    ~NcclCommunicator() override;
    std::string name() const override;

    // ncclAllReduce (sum, in place), ncclAllGather, ncclBroadcast (in place), on the stream.
    void all_reduce_sum(void* buf, size_t count, DType dtype) override;
    void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
    void broadcast(void* buf, size_t count, DType dtype, int root) override;
    // ncclSend / ncclRecv on the stream. A send to this rank itself is held back and issued with
    // its matching recv in one NCCL group (on one stream they would otherwise wait for each
    // other forever), so `buf` of such a send must keep its value until that recv is called.
    void send(const void* buf, size_t count, DType dtype, int peer) override;
    void recv(void* buf, size_t count, DType dtype, int peer) override;
    // An all-reduce of one value, then waits for the stream on the host, polling NCCL for an
    // asynchronous error (a peer that died): the communicator is aborted and Error thrown instead
    // of hanging. Not callable while the stream is being captured into a graph.
    void barrier() override;

    // Throws Error (after aborting the communicator) if NCCL reports an asynchronous error, e.g. a
    // peer process died. Cheap: callers waiting on the stream may poll it.
    void check_async_error();

    void* stream() const { return stream_; }

  private:
    NcclCommunicator(const NcclId& id, int rank, int size, int device, void* stream);

    struct PendingSend {  // a send to self waiting for its recv
        const void* buf;
        size_t count;
        DType dtype;
    };

    void check_peer(int peer, const char* op) const;
    void check(int result, const char* call);
    std::string last_error_suffix() const;

    const NcclLibrary* lib_ = nullptr;
    void* comm_ = nullptr;            // ncclComm_t
    void* stream_ = nullptr;          // cudaStream_t
    void* context_ = nullptr;         // CUcontext: the device's primary context (retained)
    int device_ = 0;                  // CUDA device ordinal
    int cu_device_ = 0;               // its CUdevice handle (context release takes it)
    unsigned long long scratch_ = 0;  // CUdeviceptr: one f32 on the device, the barrier's all-reduce buffer
    std::deque<PendingSend> self_sends_;
    bool aborted_ = false;
};

}  // namespace peregrine
