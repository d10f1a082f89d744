// NcclCommunicator (src/dist/nccl_communicator.h) on one GPU with a world of 1: every collective
// with odd counts in f32 and bf16 on device buffers, send/recv to itself, the barrier, and an
// all-reduce captured into a CUDA graph. Outputs are poisoned (0xFF bytes: NaN) first, so an
// element NCCL forgets to write fails the check. Skips without a GPU or without NCCL; the
// multi-GPU run is its own issue.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/nccl_communicator.h"
#include "support/cuda_test_util.h"

namespace peregrine {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::random_floats;
using cuda_test::to_bf16;

#define PG_SKIP_WITHOUT_NCCL()                                                                   \
    do {                                                                                         \
        PG_SKIP_WITHOUT_CUDA();                                                                  \
        std::string why;                                                                         \
        if (!NcclCommunicator::available(&why)) GTEST_SKIP() << "NCCL not usable here: " << why; \
    } while (0)

constexpr size_t kOddCounts[] = {1, 7, 333, 4099};

// A world of 1 on device 0, its ops on a stream of its own (as the backend's step stream).
class NcclWorldOfOne : public ::testing::Test {
  protected:
    void SetUp() override {
        PG_SKIP_WITHOUT_NCCL();
        PG_CUDA_CHECK(cudaSetDevice(0));
        // A blocking stream: it waits for the test buffers' fills and copies on the legacy stream.
        PG_CUDA_CHECK(cudaStreamCreate(&stream_));
        comm_ = NcclCommunicator::create(NcclCommunicator::new_id(), 0, 1, 0, stream_);
    }
    void TearDown() override {
        comm_.reset();
        if (stream_) cudaStreamDestroy(stream_);
    }
    void sync() { PG_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

    template <typename T>
    std::vector<T> download(const DeviceBuffer<T>& b) {
        sync();
        return b.download();
    }

    cudaStream_t stream_ = nullptr;
    std::unique_ptr<NcclCommunicator> comm_;
};

// Host values of `count` elements of `dtype`, as raw bytes (f32 or bf16 bit patterns).
std::vector<uint8_t> random_bytes(size_t count, DType dtype, std::mt19937& rng) {
    const std::vector<float> f = random_floats(count, rng);
    std::vector<uint8_t> out(count * comm_element_size(dtype));
    if (dtype == DType::F32) {
        std::memcpy(out.data(), f.data(), out.size());
    } else {
        const std::vector<uint16_t> h = to_bf16(f);
        std::memcpy(out.data(), h.data(), out.size());
    }
    return out;
}

TEST(NcclId, BytesRoundTrip) {
    NcclId id;
    for (size_t i = 0; i < id.data.size(); ++i) id.data[i] = static_cast<char>(i * 7 + 1);
    const std::string b = id.bytes();
    ASSERT_EQ(b.size(), 128u);
    EXPECT_EQ(NcclId::from_bytes(b).data, id.data);
    EXPECT_THROW(NcclId::from_bytes("short"), Error);
}

TEST(NcclId, NewIdsDiffer) {
    std::string why;
    if (!NcclCommunicator::available(&why)) GTEST_SKIP() << "NCCL not usable here: " << why;
    EXPECT_NE(NcclCommunicator::new_id().data, NcclCommunicator::new_id().data);
}

TEST_F(NcclWorldOfOne, Name) {
    EXPECT_EQ(comm_->rank(), 0);
    EXPECT_EQ(comm_->size(), 1);
    EXPECT_NE(comm_->name().find("rank 0 of 1, CUDA device 0"), std::string::npos) << comm_->name();
}

TEST_F(NcclWorldOfOne, AllReduceBroadcastAllGather) {
    std::mt19937 rng(3);
    for (DType dtype : {DType::F32, DType::BF16}) {
        for (size_t count : kOddCounts) {
            SCOPED_TRACE(std::string(dtype_name(dtype)) + " x " + std::to_string(count));
            const std::vector<uint8_t> in = random_bytes(count, dtype, rng);
            const size_t bytes = in.size();

            // All-reduce and broadcast in place: a world of 1 leaves the values as they are.
            DeviceBuffer<uint8_t> buf(in);
            comm_->all_reduce_sum(buf.get(), count, dtype);
            EXPECT_EQ(download(buf), in);
            comm_->broadcast(buf.get(), count, dtype, 0);
            EXPECT_EQ(download(buf), in);

            // All-gather into a poisoned [size * count] buffer.
            DeviceBuffer<uint8_t> gathered(bytes);
            gathered.fill_bytes(0xFF);
            comm_->all_gather(buf.get(), gathered.get(), count, dtype);
            EXPECT_EQ(download(gathered), in);
        }
    }
}

TEST_F(NcclWorldOfOne, SendRecvToItselfInOrder) {
    std::mt19937 rng(5);
    for (DType dtype : {DType::F32, DType::BF16}) {
        const size_t count = 1001;
        const std::vector<uint8_t> a = random_bytes(count, dtype, rng), b = random_bytes(count, dtype, rng);
        DeviceBuffer<uint8_t> da(a), db(b), ra(a.size()), rb(b.size());
        ra.fill_bytes(0xFF);
        rb.fill_bytes(0xFF);
        comm_->send(da.get(), count, dtype, 0);
        comm_->send(db.get(), count, dtype, 0);
        comm_->recv(ra.get(), count, dtype, 0);  // the first send
        comm_->recv(rb.get(), count, dtype, 0);  // the second
        EXPECT_EQ(download(ra), a);
        EXPECT_EQ(download(rb), b);
    }
}

TEST_F(NcclWorldOfOne, Barrier) {
    comm_->barrier();
    comm_->barrier();
    comm_->check_async_error();
}

TEST_F(NcclWorldOfOne, AllReduceReplaysFromACudaGraph) {
    std::mt19937 rng(9);
    const size_t count = 513;
    const std::vector<uint8_t> in = random_bytes(count, DType::BF16, rng);
    DeviceBuffer<uint8_t> buf(in);
    sync();
    cudaGraph_t graph = nullptr;
    PG_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    comm_->all_reduce_sum(buf.get(), count, DType::BF16);
    PG_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    PG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) PG_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    EXPECT_EQ(download(buf), in);
    PG_CUDA_CHECK(cudaGraphExecDestroy(exec));
    PG_CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST_F(NcclWorldOfOne, BadArgumentsAreErrors) {
    DeviceBuffer<float> buf(4);
    EXPECT_THROW(comm_->all_reduce_sum(buf.get(), 4, DType::F16), Error);
    EXPECT_THROW(comm_->broadcast(buf.get(), 4, DType::F32, 1), Error);
    EXPECT_THROW(comm_->send(buf.get(), 4, DType::F32, 2), Error);
    EXPECT_THROW(comm_->recv(buf.get(), 4, DType::F32, 0), Error);  // no send to itself before it
    comm_->send(buf.get(), 4, DType::F32, 0);
    EXPECT_THROW(comm_->recv(buf.get(), 3, DType::F32, 0), Error);  // count differs from the send's
}

}  // namespace
}  // namespace peregrine
