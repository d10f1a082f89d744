// Collectives between the ranks of one model-parallel group (tensor or pipeline parallel):
// one rank per process. Two implementations: NCCL on the GPU (ops enqueued on the step's
// stream, capturable in CUDA graphs) and shared memory between CPU processes of one host.
//
// Buffers are `count` elements of `dtype` (F32 or BF16) in the memory this communicator's ranks
// compute in (device memory for NCCL, host memory for the CPU one). Every rank of the group
// must call the same collectives in the same order with the same counts; a rank that dies or
// stops answering makes the others throw Error naming it instead of waiting forever.
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"

namespace peregrine {

class Communicator {
  public:
    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    virtual std::string name() const = 0;  // e.g. "shm (rank 1 of 4)", for logs

    // In place: every rank ends with the elementwise sum over ranks of buf [count]. The sum is
    // taken in rank order (in f32 for bf16), so every rank gets the same bits.
    virtual void all_reduce_sum(void* buf, size_t count, DType dtype) = 0;
    // recv [size() * count] = rank 0's send [count], then rank 1's, ... on every rank.
    virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
    // buf [count] of rank `root` copied to every rank.
    virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
    // Point to point (pipeline stages): each send is matched by one recv of the same count on
    // `peer`, in order.
    virtual void send(const void* buf, size_t count, DType dtype, int peer) = 0;
    virtual void recv(void* buf, size_t count, DType dtype, int peer) = 0;
    // Returns once every rank has called it.
    virtual void barrier() = 0;

  protected:
    Communicator(int rank, int size) : rank_(rank), size_(size) {}
    const int rank_;  // in [0, size_)
    const int size_;
};

// Bytes of one element of a collective's dtype (F32: 4, BF16: 2); throws for other dtypes.
size_t comm_element_size(DType dtype);

}  // namespace peregrine
