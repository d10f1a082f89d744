// The peer-memory collectives (backend/cuda/peer_collectives.h) between processes on different
// GPUs of this host: reduce_add leaves residual + the f32 sum of the ranks' inputs in rank order,
// bit for bit as the host computes it, for sizes from one float4 to a slot, in many calls in a
// row (both parities, epochs advancing) and replayed from a CUDA graph; the in-place all-reduce
// and the all-gather, interleaved with it, give the sums and every rank's slice; inexact sums
// come out with the same bits on every rank. The ranks are this binary started again
// (posix_spawn, a fresh process per GPU) running PeerCollectives.RankHelper; the IPC handles go
// round through a shared-memory communicator. Needs >= 2 GPUs that reach each other's memory
// (skipped otherwise). PG_PEER_BENCH=1 also times a call at decode-step sizes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/peer_collectives.h"
#include "dist/shm_communicator.h"
#include "support/self_ranks.h"

namespace peregrine {
namespace {

using cuda::PeerCollectives;

// Rank r's input of call `call`, element i: multiples of 1/1024 below 64, so every sum here is
// exact in f32 and the host's result cannot depend on how its compiler orders or contracts it.
float input(int r, int call, size_t i) {
    return static_cast<float>(static_cast<int>((i * 7 + r * 13 + call * 5) % 97) - 48) / 64.0f +
           static_cast<float>(r) / 1024.0f;
}
float start_value(size_t i) {
    return static_cast<float>(i % 31) * 0.25f;
}

// The residual after `calls` calls numbered first..first+calls-1, as the kernel computes it.
std::vector<float> expected(int size, int first, int calls, size_t n) {
    std::vector<float> res(n);
    for (size_t i = 0; i < n; ++i) res[i] = start_value(i);
    for (int c = first; c < first + calls; ++c)
        for (size_t i = 0; i < n; ++i) {
            float s = input(0, c, i);
            for (int r = 1; r < size; ++r) s += input(r, c, i);
            res[i] += s;
        }
    return res;
}

struct DeviceVec {
    float* p = nullptr;
    explicit DeviceVec(size_t n) { PG_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float))); }
    ~DeviceVec() { cudaFree(p); }
    // cudaMemcpy from pageable memory may return before the copy has landed, and the test's
    // stream does not wait for the legacy stream: synchronize the device before any kernel.
    void put(const std::vector<float>& v) {
        PG_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
        PG_CUDA_CHECK(cudaDeviceSynchronize());
    }
    std::vector<float> get(size_t n) const {
        std::vector<float> v(n);
        PG_CUDA_CHECK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
        return v;
    }
};

// One rank, when started by TwoAndMoreGpus (skipped otherwise).
TEST(PeerCollectives, RankHelper) {
    const char* rank_env = std::getenv("PG_PEER_RANK");
    if (!rank_env) GTEST_SKIP() << "a rank of PeerCollectives.TwoAndMoreGpus";
    const int rank = std::atoi(rank_env), size = std::atoi(std::getenv("PG_PEER_SIZE"));
    PG_CUDA_CHECK(cudaSetDevice(rank));
    auto comm = ShmCommunicator::create(std::getenv("PG_PEER_GROUP"), rank, size, 60);

    PeerCollectives ar(rank, size, rank);
    std::string h = ar.handle();
    ASSERT_LT(h.size(), 255u);
    std::vector<char> mine(256, 0), all(256 * size);
    std::memcpy(mine.data(), h.data(), h.size());
    comm->all_gather(mine.data(), all.data(), 64, DType::F32);  // 256 bytes a rank
    std::vector<std::string> handles;
    for (int r = 0; r < size; ++r) handles.emplace_back(all.data() + 256 * r);
    for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        ASSERT_TRUE(ar.can_reach(PeerCollectives::handle_device(handles[r]))) << "GPU " << r;
    }
    EXPECT_FALSE(ar.fits(4096)) << "not open yet";
    ar.open(handles);
    EXPECT_TRUE(ar.fits(4096));
    EXPECT_FALSE(ar.fits(4098)) << "not a multiple of 4";
    EXPECT_FALSE(ar.fits(PeerCollectives::kSlotBytes / 4 + 4)) << "over the capacity";

    cudaStream_t stream;
    PG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const size_t cap = PeerCollectives::kSlotBytes / 4;
    // Eager: sizes from one float4 to the capacity (and sizes over the grid's threads), 5 calls each.
    for (const size_t n : {size_t(4), size_t(4096), size_t(8192 * 4 + 12), size_t(65536), cap}) {
        DeviceVec x(n), res(n);
        std::vector<float> host(n);
        for (size_t i = 0; i < n; ++i) host[i] = start_value(i);
        res.put(host);
        for (int c = 0; c < 5; ++c) {
            for (size_t i = 0; i < n; ++i) host[i] = input(rank, c, i);
            x.put(host);  // the previous call has finished reading x
            ar.reduce_add(x.p, res.p, n, stream);
            PG_CUDA_CHECK(cudaStreamSynchronize(stream));
        }
        const std::vector<float> got = res.get(n), want = expected(size, 0, 5, n);
        size_t bad = 0, first_bad = n;
        for (size_t i = 0; i < n; ++i)
            if (std::memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0) first_bad = i;
        ASSERT_EQ(bad, 0u) << "rank " << rank << ", " << n << " floats: first at " << first_bad << ": "
                           << (bad ? got[first_bad] : 0.0f) << " vs " << (bad ? want[first_bad] : 0.0f);
    }
    // The in-place all-reduce and the all-gather, between reduce_add calls (one epoch sequence).
    {
        const size_t n = 8192;
        DeviceVec buf(n), send(n), recv(n * size), x(n), res(n);
        std::vector<float> host(n), zeros(n, 0.0f);
        res.put(zeros);
        for (int c = 0; c < 3; ++c) {
            for (size_t i = 0; i < n; ++i) host[i] = input(rank, c, i);
            buf.put(host);
            ar.all_reduce(buf.p, n, stream);
            for (size_t i = 0; i < n; ++i) host[i] = input(rank, c + 10, i);
            send.put(host);
            ar.all_gather(send.p, recv.p, n, stream);
            x.put(host);
            ar.reduce_add(x.p, res.p, n, stream);
            PG_CUDA_CHECK(cudaStreamSynchronize(stream));
            std::vector<float> want(n), want_all(n * size);
            for (size_t i = 0; i < n; ++i) {
                want[i] = input(0, c, i);
                for (int r = 1; r < size; ++r) want[i] += input(r, c, i);
                for (int r = 0; r < size; ++r) want_all[r * n + i] = input(r, c + 10, i);
            }
            const std::vector<float> got = buf.get(n), got_all = recv.get(n * size);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << "rank " << rank << ", all_reduce " << c;
            ASSERT_EQ(std::memcmp(got_all.data(), want_all.data(), n * size * 4), 0)
                << "rank " << rank << ", all_gather " << c;
        }
    }
    // Inexact values (sums that round): every rank must still end with the same bits.
    {
        const size_t n = 4096;
        DeviceVec x(n), res(n);
        std::vector<float> host(n);
        for (size_t i = 0; i < n; ++i)
            host[i] =
                0.1f * static_cast<float>(i % 13) + 1e-3f * static_cast<float>(rank + 1) * static_cast<float>(i % 7);
        x.put(host);
        for (size_t i = 0; i < n; ++i) host[i] = 1.0f / static_cast<float>(i + 3);
        res.put(host);
        for (int c = 0; c < 3; ++c) ar.reduce_add(x.p, res.p, n, stream);
        PG_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<float> got = res.get(n);
        std::vector<float> every(n * size);
        comm->all_gather(got.data(), every.data(), n, DType::F32);
        for (int r = 1; r < size; ++r)
            ASSERT_EQ(std::memcmp(every.data(), every.data() + r * n, n * 4), 0)
                << "rank " << r << "'s bits differ from rank 0's";
    }
    // A graph of three calls on three inputs, replayed four times: 12 calls, inputs cycling.
    {
        const size_t n = 4096;  // one decode token of an 8B model's hidden size
        DeviceVec x0(n), x1(n), x2(n), res(n);
        DeviceVec* xs[3] = {&x0, &x1, &x2};
        std::vector<float> host(n);
        for (int c = 0; c < 3; ++c) {
            for (size_t i = 0; i < n; ++i) host[i] = input(rank, c, i);
            xs[c]->put(host);
        }
        for (size_t i = 0; i < n; ++i) host[i] = start_value(i);
        res.put(host);
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        PG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int c = 0; c < 3; ++c) ar.reduce_add(xs[c]->p, res.p, n, stream);
        PG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        PG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 4; ++rep) PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        PG_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<float> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = start_value(i);
        for (int rep = 0; rep < 4; ++rep)
            for (int c = 0; c < 3; ++c)  // call by call, as the kernel adds
                for (size_t i = 0; i < n; ++i) {
                    float s = input(0, c, i);
                    for (int r = 1; r < size; ++r) s += input(r, c, i);
                    want[i] += s;
                }
        const std::vector<float> got = res.get(n);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << "rank " << rank << ", graph replays";
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    // PG_PEER_BENCH=1: the time of one call at decode-step sizes, 64 calls a graph (as a decode
    // step of a 32-layer model makes them), printed by rank 0.
    if (std::getenv("PG_PEER_BENCH")) {
        for (const size_t bytes :
             {size_t(8) << 10, size_t(16) << 10, size_t(64) << 10, size_t(256) << 10, PeerCollectives::kSlotBytes}) {
            const size_t n = bytes / 4;
            DeviceVec x(n), res(n);
            PG_CUDA_CHECK(cudaMemset(x.p, 0, bytes));
            PG_CUDA_CHECK(cudaMemset(res.p, 0, bytes));
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            PG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            for (int c = 0; c < 64; ++c) ar.reduce_add(x.p, res.p, n, stream);
            PG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
            PG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            for (int w = 0; w < 5; ++w) PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            PG_CUDA_CHECK(cudaStreamSynchronize(stream));
            comm->barrier();
            cudaEvent_t t0, t1;
            PG_CUDA_CHECK(cudaEventCreate(&t0));
            PG_CUDA_CHECK(cudaEventCreate(&t1));
            const int reps = 50;
            PG_CUDA_CHECK(cudaEventRecord(t0, stream));
            for (int rep = 0; rep < reps; ++rep) PG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
            PG_CUDA_CHECK(cudaEventRecord(t1, stream));
            PG_CUDA_CHECK(cudaEventSynchronize(t1));
            float ms = 0;
            PG_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
            if (rank == 0)
                std::printf("peer all-reduce + add, %d ranks, %7zu B: %6.2f us a call (64 a graph)\n", size, bytes,
                            ms * 1000.0 / (reps * 64));
            cudaEventDestroy(t0);
            cudaEventDestroy(t1);
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
    }
    cudaStreamDestroy(stream);
    comm->barrier();  // no rank unmaps a buffer a peer still reads
}

int run_ranks(int size) {
    const std::string group = "peer-ar-test-" + std::to_string(::getpid()) + "-" + std::to_string(size);
    return testing::run_self_ranks("PeerCollectives.RankHelper", size, [&](int r) {
        return std::vector<std::string>{"PG_PEER_RANK=" + std::to_string(r), "PG_PEER_SIZE=" + std::to_string(size),
                                        "PG_PEER_GROUP=" + group};
    });
}

TEST(PeerCollectives, TwoAndMoreGpus) {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
    int ok = 0;
    if (cudaDeviceCanAccessPeer(&ok, 0, 1) != cudaSuccess || !ok) GTEST_SKIP() << "GPUs 0 and 1 are not peers";
    for (int size = 2; size <= gpus && size <= PeerCollectives::kMaxRanks; size *= 2)
        EXPECT_EQ(run_ranks(size), 0) << size << " ranks: a rank failed (its output is above)";
}

}  // namespace
}  // namespace peregrine
