// A tensor-parallel group's communicator on the GPUs of one host: f32 all-reduces and
// all-gathers of up to PeerCollectives::kSlotBytes a rank go through the peer-memory kernels
// (peer_collectives.h), everything else through the wrapped communicator (NCCL). The backend's
// blocks also call reduce_add, which folds the residual add into the all-reduce.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/peer_collectives.h"
#include "dist/communicator.h"

namespace peregrine {

// Hands this rank's string to the other ranks of the group and returns every rank's, in rank
// order (this rank's included). `round` names the exchange; every rank makes the same ones.
using PeerExchange = std::function<std::vector<std::string>(const std::string& round, const std::string& mine)>;

class PeerCommunicator final : public Communicator {
  public:
    // Collective over `inner`'s group: every rank calls it with its GPU and the stream `inner`
    // enqueues on. Returns a PeerCommunicator on every rank when every rank's GPU is another GPU
    // of this host that reaches the others' memory, else `inner` itself on every rank (with the
    // reason on stderr where a rank could not take part).
    static std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> inner, int device, void* stream,
                                              const PeerExchange& exchange);

    std::string name() const override { return "peer memory + " + inner_->name(); }
    void all_reduce_sum(void* buf, size_t count, DType dtype) override;
    void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
    void broadcast(void* buf, size_t count, DType dtype, int root) override {
        inner_->broadcast(buf, count, dtype, root);
    }
    void send(const void* buf, size_t count, DType dtype, int peer) override { inner_->send(buf, count, dtype, peer); }
    void recv(void* buf, size_t count, DType dtype, int peer) override { inner_->recv(buf, count, dtype, peer); }
    void barrier() override { inner_->barrier(); }

    // Whether reduce_add takes `count` f32 elements (the same answer on every rank).
    bool fits(size_t count) const { return peer_->fits(count); }
    // out [count] f32 += the rank-order sum of every rank's x [count], on the stream.
    void reduce_add(const float* x, float* out, size_t count);

  private:
    PeerCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<cuda::PeerCollectives> peer, void* stream);

    std::unique_ptr<Communicator> inner_;
    std::unique_ptr<cuda::PeerCollectives> peer_;
    void* stream_;  // cudaStream_t
};

}  // namespace peregrine
